"""Every config file shipped in configs/ loads into its command's config and passes that
command's checks: a renamed key or a TRL argument that no longer exists fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from collabrl.cli.options import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _command(path: Path) -> str:
    if path.parent.name == "eval":
        return "eval"
    if path.name.startswith("sft-"):
        return "train-sft"
    return f"train-{yaml.safe_load(path.read_text())['method']}"  # the command it is for


@pytest.mark.parametrize(
    "path", sorted([*CONFIGS.glob("train/*.yaml"), *CONFIGS.glob("eval/*.yaml")]), ids=str
)
def test_a_shipped_config_loads_and_passes_its_checks(path: Path) -> None:
    command = _command(path)
    # The SFT configs leave --data to the command line (the rows of a build).
    given = {"data": "runs/warmup-relay"} if command == "train-sft" else {}
    load_config(command, path, given, []).check()


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("accelerate/*.yaml")), ids=str)
def test_an_accelerate_config_names_its_launch(path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    assert config["distributed_type"] in {"MULTI_GPU", "DEEPSPEED", "MULTI_CPU"}
    assert config["num_processes"] >= 2 and config["num_machines"] == 1
