"""A training run's config.yaml (issue 34): the method's own fields and its protocol's
section only, so a relay run carries no consult, strategy, apollo, schedule or rsim
keys; it loads back as the run's config, and a folder saved whole before still resumes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from collabrl import runs
from collabrl.cli.options import load_config
from collabrl.config import save_config
from collabrl.errors import UserError
from collabrl.protocols import registry
from collabrl.train.grpo import train_grpo
from collabrl.train.grpo_config import RESUMABLE_KEYS, others_fields
from collabrl.train.resolve import resolve_run
from collabrl.train.run import METRICS, resumed_config, started_run

# The fields another method than relay reads.
NOT_RELAYS = set(others_fields("relay"))


def relay_config(model: Path | str, out: Path, **changes: Any) -> Any:
    """A `collab train relay` config, resolved as the command resolves it."""
    layer = {
        "model": str(model),
        "data": "arith_train",
        "limit": 8,
        "out": str(out),
        "steps": 1,
        "prompts_per_step": 2,
        "sampling": {"n": 2, "max_tokens": 16},
        "save_steps": 1,
        "protocol": {"teacher": "reference"},
    }
    return load_config("train-relay", None, layer | changes, [])


def test_a_relay_runs_config_yaml_holds_what_relay_reads(tiny_model_dir: Path, tmp_path) -> None:
    config = relay_config(tiny_model_dir, tmp_path)

    train_grpo(resolve_run(config))

    text = (tmp_path / runs.CONFIG).read_text()
    saved = yaml.safe_load(text)
    assert NOT_RELAYS and not NOT_RELAYS & set(saved)
    relay = registry.get("relay")
    others = {spec.section for spec in registry.specs() if spec.section != relay.section}
    others |= {c.key for spec in registry.specs() for c in spec.collaborators}
    others -= {c.key for c in relay.collaborators}
    assert not (others | {"options"}) & set(saved["protocol"])  # experts, consult, ...
    assert saved["protocol"]["name"] == "relay"  # the method's protocol, not solo
    assert saved["reward"] == config.reward and "relay" in saved["protocol"]
    assert text.startswith("# written by collabrl")
    # As a --config file it is the run's config again (what it left out: the defaults).
    path = tmp_path / runs.CONFIG
    assert load_config("train-relay", path, {}, []) == config


def test_an_old_relay_folder_saved_whole_resumes(tmp_path: Path) -> None:
    config = relay_config("smollm2-135m", tmp_path)
    save_config(config, tmp_path / runs.CONFIG)  # before issue 34: every section
    (tmp_path / METRICS).write_text('{"step": 1}\n')  # bound: it has trained
    unread = resolve_run(config).unread_keys()
    other = dataclasses.replace(config, reward="simple")
    with (
        pytest.raises(UserError, match="different reward"),
        started_run(other, tmp_path, RESUMABLE_KEYS, config.steps, unread),
    ):
        pass

    with started_run(config, tmp_path, RESUMABLE_KEYS, config.steps, unread):
        pass

    assert "schedule" not in yaml.safe_load((tmp_path / runs.CONFIG).read_text())
    assert resumed_config(dataclasses.replace(config, resume=True), tmp_path) == config


def test_resuming_into_another_commands_folder_is_refused_by_name(tmp_path: Path) -> None:
    """`collab train relay --resume --out EVAL_FOLDER`: the folder's config.yaml is an
    eval's; the error says so, not that an eval key is unknown."""
    save_config(load_config("eval", None, {"model": "smollm2-135m"}, []), tmp_path / runs.CONFIG)
    config = relay_config("smollm2-135m", tmp_path)
    with pytest.raises(UserError, match="holds another command's run"):
        resumed_config(dataclasses.replace(config, resume=True), tmp_path)
