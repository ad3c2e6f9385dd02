"""`collab train grpo|relay|eapo` as a user runs them: a real process on the tiny model,
one-line refusals, and the shared config listing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import COLLAB, assert_one_line_error, collab


def test_relay_trains_with_the_reference_teacher(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = collab(
        "train", "relay", "--model", str(tiny_model_dir), "--teacher", "reference",
        "--data", "arith_train", "--limit", "4", "--steps", "1", "--prompts-per-step", "2",
        "--num-generations", "2", "--max-tokens", "12", "--eval-data", "arith",
        "--eval-limit", "2", "--out", "run", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "method: relay" in config and "teacher: reference" in config
    logged = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert logged[0]["step"] == 1 and "episodes/call_ratio" in logged[0]
    assert "final" in result.stdout
    assert "held-out arith" in result.stdout and (tmp_path / "run" / "eval.json").is_file()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["relay"], "needs a teacher"),
        (["eapo"], "needs experts"),
        (["grpo", "--num-generations", "1"], "--num-generations"),
        (["grpo", "--set", "reward=fancy"], "unknown reward"),
        (["grpo", "--model", "no-such-model"], "no-such-model"),
    ],
)
def test_bad_runs_are_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = collab("train", *args, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert_one_line_error(result, fragment)


def test_config_show_lists_the_grpo_fields() -> None:
    shown = subprocess.run(
        [str(COLLAB), "config", "show", "train-grpo"], capture_output=True, text=True, check=True
    ).stdout
    assert "num_generations:" in shown and "schedule:" in shown and "reward:" in shown
