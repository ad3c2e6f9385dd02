"""Tests for the config of `collab train grpo|relay|eapo|rsim` as a leaf (issue 34): it
imports no trainer and not TRL, and a method's resolved config names the protocol the
method rolls out on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from collabrl.config import build_config, save_config
from collabrl.protocols.config import ProtocolConfig
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.methods import registry as methods
from collabrl.train.run import resumed_config

TRAIN = Path(__file__).parents[2] / "collabrl" / "train"
# The config-only modules of train/: what a config may import of its own package. The
# method registry and spec are among them: the config looks its method's spec up, and
# the registry loads the method modules by name, only when asked.
CONFIG_MODULES = (
    *("grpo_config", "schedule_config", "rsim_config", "trackers", "lora"),
    *("methods/spec", "methods/registry"),
)


def _imported(path: Path) -> set[str]:
    """Every module `path` imports, wherever the import is written (type-only included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", CONFIG_MODULES)
def test_the_training_configs_import_no_trainer_and_not_trl(module: str) -> None:
    imported = _imported(TRAIN / f"{module}.py")
    allowed = {f"collabrl.train.{name.replace('/', '.')}" for name in CONFIG_MODULES}
    allowed.add("collabrl.train.methods")  # `from collabrl.train.methods import registry`
    trainer_side = sorted(
        name for name in imported if name.startswith("collabrl.train.") and name not in allowed
    )
    assert not trainer_side, f"train/{module}.py imports the trainer side: {trainer_side}"
    assert not {name for name in imported if name.split(".")[0] == "trl"}


@pytest.mark.parametrize("method", methods.grpo_names())
def test_a_methods_resolved_config_names_its_protocol(method: str) -> None:
    config = build_config(GRPOTrainConfig, [{"method": method}])
    assert config.protocol.name == methods.get(method).protocol


def test_config_show_of_train_relay_says_relay() -> None:
    from typer.testing import CliRunner

    from collabrl.cli.main import app

    result = CliRunner().invoke(app, ["config", "show", "train-relay"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["protocol"]["name"] == "relay"


def test_grpo_keeps_the_protocol_it_is_given() -> None:
    apollo = GRPOTrainConfig(protocol=ProtocolConfig(name="apollo"))
    assert apollo.protocol.name == "apollo"
    assert GRPOTrainConfig().protocol.name == "solo"


def test_a_run_folder_saved_saying_solo_resumes_as_the_methods_protocol(tmp_path: Path) -> None:
    """A relay run saved before the method's protocol was written says `solo`: it reads
    back as the run it was, so --resume finds the same experiment."""
    teacher = ProtocolConfig(teacher="reference")
    config = GRPOTrainConfig(method="relay", protocol=teacher, out=str(tmp_path), resume=True)
    old = GRPOTrainConfig(method="relay", protocol=teacher, out=str(tmp_path), resume=True)
    old.protocol.name = "solo"  # what config.yaml said before
    save_config(old, tmp_path / "config.yaml")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["protocol"]["name"] == "solo"
    assert resumed_config(config, tmp_path) == config
