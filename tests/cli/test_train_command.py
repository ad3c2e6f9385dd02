"""`collab train grpo|relay|eapo|rsim` as a user runs them: a real process on the tiny model,
one-line refusals, and the shared config listing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

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
        (["rsim"], "needs a planner"),
        (["rsim", "--planner", "smollm2-135m", "--train", "both"], "unknown rsim.train"),
        (["rsim", "--planner", "http://localhost:1"], "cannot be reached"),
    ],
)
def test_bad_runs_are_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = collab("train", *args, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert_one_line_error(result, fragment)


def test_rsim_trains_and_names_its_planner(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = collab(
        "train", "rsim", "--model", str(tiny_model_dir), "--planner", str(tiny_model_dir),
        "--train", "planner", "--data", "arith_train", "--limit", "4", "--steps", "1",
        "--prompts-per-step", "2", "--num-generations", "2", "--max-tokens", "16",
        "--set", "protocol.strategy.max_steps=2", "--eval-data", "arith", "--eval-limit", "2",
        "--out", "run", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "planner reward" in result.stdout and "use it as --planner" in result.stdout
    assert (tmp_path / "run" / "planner" / "planner.json").is_file()
    # The trained reasoner is evaluated with the trained planner, greedy (temperature 0).
    evaluated = yaml.safe_load((tmp_path / "run" / "eval-final" / "config.yaml").read_text())
    strategy = evaluated["protocol"]["strategy"]
    assert evaluated["protocol"]["planner"] == "run/planner"  # the --out given, relative
    assert strategy["planner_temperature"] == 0.0 and strategy["max_steps"] == 2


def test_config_show_lists_the_grpo_fields() -> None:
    shown = subprocess.run(
        [str(COLLAB), "config", "show", "train-grpo"], capture_output=True, text=True, check=True
    ).stdout
    assert "sampling:" in shown and "schedule:" in shown and "reward:" in shown


def _grpo_args(model: Path, steps: int, *more: str) -> list[str]:
    return [
        "train", "grpo", "--model", str(model), "--data", "arith_train", "--limit", "8",
        "--steps", str(steps), "--prompts-per-step", "2", "--num-generations", "2",
        "--max-tokens", "8", "--set", "save_steps=1", "--out", "run", *more,
    ]  # fmt: skip


def test_a_run_killed_with_sigkill_resumes_from_its_last_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import os
    import signal
    import time

    run = tmp_path / "run"
    process = subprocess.Popen(
        [str(COLLAB), *_grpo_args(tiny_model_dir, 40)],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if (run / "checkpoints" / "checkpoint-2" / "trainer_state.json").exists():
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (run / "final").exists(), "the kill came after the run finished"

    fresh = collab(*_grpo_args(tiny_model_dir, 4), cwd=tmp_path)
    assert_one_line_error(fresh, "already holds checkpoints", "--resume")
    resumed = collab(*_grpo_args(tiny_model_dir, 4, "--resume"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in logged if "reward" in h] == [1, 2, 3, 4]  # none twice
    assert (run / "final" / "config.json").is_file()
