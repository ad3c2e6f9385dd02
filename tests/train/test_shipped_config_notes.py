"""Every shipped config loads, through its command's config loader and checks, without a
note or warning of its own: a renamed key (`lora: true` for `lora.enabled`) or a
deprecated TRL argument in a config we ship would greet every user who copies it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from collabrl.cli.options import load_config
from tests.configs.test_shipped_configs import CONFIGS, _command

SHIPPED = sorted([*CONFIGS.glob("train/*.yaml"), *CONFIGS.glob("eval/*.yaml")])


def _load_and_check(path: Path) -> None:
    """As the command does before it runs: load, then check (a GRPO config through
    `check_run`, which builds TRL's arguments and reads the trl block)."""
    command = _command(path)
    given = {"data": "runs/warmup-relay"} if command == "train-sft" else {}
    config = load_config(command, path, given, [])
    if command.startswith("train-") and command != "train-sft":
        from collabrl.train.grpo_args import check_run

        check_run(config)
    else:
        config.check()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_config_prints_no_note_or_deprecation(path: Path, capsys) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _load_and_check(path)
    printed = capsys.readouterr()
    assert "note:" not in printed.err and "deprecat" not in printed.err.lower(), printed.err
    deprecations = [
        str(w.message) for w in caught if issubclass(w.category, DeprecationWarning | FutureWarning)
    ]
    assert deprecations == []
