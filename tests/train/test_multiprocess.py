"""`collab train relay` under `accelerate launch` with two CPU processes (gloo): each
process rolls out its share of the batch, the difficulty-aware reward gathers every
sample before deciding a group's scenario, one process evaluates and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launch import launch_two

# The held-out problems of the --eval-steps run: odd, so the two processes' shares differ.
HELD_OUT = 5


@pytest.mark.slow
def test_relay_trains_on_two_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = [
        "-m", "collabrl", "train", "relay",
        "--model", str(tiny_model_dir), "--teacher", "reference", "--data", "arith_train",
        "--limit", "16", "--steps", "2", "--prompts-per-step", "2", "--num-generations", "2",
        "--max-tokens", "12", "--eval-data", "arith", "--eval-limit", "2", "--out", "run",
    ]  # fmt: skip
    done = launch_two(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [h["step"] for h in logged if "reward" in h] == [1, 2]  # one writer, not two
    # One process evaluates and reports: one announcement, one table, one line a step.
    assert done.stdout.count("evaluating the start policy") == 1
    assert done.stdout.count("step 2/2 · ") == 1
    evaluation = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert evaluation.keys() == {"start", "final", "paired"}


@pytest.mark.slow
def test_rsim_trains_planner_and_reasoner_on_two_processes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The planner is prepared through accelerate (DDP over gloo): planner rewards are
    gathered into groups across processes, and the run ends with one saved planner. Its
    loss runs in chunks of one decision with both agents checkpointed: the processes hold
    different numbers of decisions, hence of chunks, and must still meet in the same
    all-reduces (a process left waiting in one would hang: the timeout fails it)."""
    args = [
        "-m", "collabrl", "train", "rsim",
        "--model", str(tiny_model_dir), "--planner", str(tiny_model_dir), "--data", "arith_train",
        "--limit", "16", "--steps", "2", "--prompts-per-step", "2", "--num-generations", "2",
        "--max-tokens", "16", "--set", "protocol.strategy.max_steps=3", "--set", "save_steps=1",
        "--set", "protocol.strategy.end=eos", "--set", "rsim.planner_chunk=1",
        "--set", "trl.gradient_checkpointing=true", "--out", "run",
    ]  # fmt: skip
    done = launch_two(args, tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    rows = [h for h in logged if "reward" in h]
    assert [h["step"] for h in rows] == [1, 2]
    assert "planner/reward" in rows[0] and "planner/loss" in rows[0]
    assert (tmp_path / "run" / "planner" / "planner.json").is_file()
    assert (
        tmp_path / "run" / "checkpoints" / "checkpoint-2" / "planner" / "planner.json"
    ).is_file()


@pytest.mark.slow
def test_held_out_evaluation_during_training_runs_on_every_process(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`--eval-steps` on two processes: each samples its share of the held-out set inside
    the unwrapped model (under ZeRO-3 that gathers the weights, a collective both must
    enter: one process alone waits in it for ever) and the main process writes them all,
    once. The subprocess timeout turns a hang into a failure."""
    args = [
        "-m", "collabrl", "train", "grpo",
        "--model", str(tiny_model_dir), "--data", "arith_train", "--limit", "8", "--steps", "2",
        "--prompts-per-step", "2", "--num-generations", "2", "--max-tokens", "8",
        "--eval-data", "arith", "--eval-limit", str(HELD_OUT), "--eval-steps", "1",
        "--out", "run",
    ]  # fmt: skip
    done = launch_two(args, tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [h["step"] for h in logged if "eval/pass@1" in h] == [1, 2]  # once a step
    for step in (1, 2):
        folder = tmp_path / "run" / f"eval-step-{step}"
        samples = [json.loads(line) for line in (folder / "samples.jsonl").open()]
        assert len(samples) == len({s["item_id"] for s in samples}) == HELD_OUT
        assert json.loads((folder / "metrics.json").read_text())["problems"] == HELD_OUT
    assert done.stdout.count("held-out arith at step 2: pass@1 ") == 1
