"""`collab train rsim` on two CPU processes (gloo) with the planner loss in chunks of
one decision and both agents checkpointed: the processes hold different numbers of
decisions, hence of chunks, and must still meet in the same all-reduces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "accelerate" / "cpu-2proc.yaml"


@pytest.mark.slow
def test_a_chunked_checkpointed_planner_trains_on_two_processes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    assert accelerate is not None
    args = [
        accelerate, "launch", "--config_file", str(CONFIG), "-m", "collabrl", "train", "rsim",
        "--model", str(tiny_model_dir), "--planner", str(tiny_model_dir), "--data", "arith_train",
        "--limit", "16", "--steps", "2", "--prompts-per-step", "2", "--num-generations", "2",
        "--max-tokens", "16", "--set", "protocol.strategy.max_steps=3",
        "--set", "protocol.strategy.end=eos", "--set", "rsim.planner_chunk=1",
        "--set", "trl.gradient_checkpointing=true", "--out", "run",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A process left waiting in an all-reduce would hang: the timeout makes it a failure.
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    rows = [h for h in logged if "reward" in h]
    assert [h["step"] for h in rows] == [1, 2] and "planner/loss" in rows[0]
    assert (tmp_path / "run" / "planner" / "planner.json").is_file()
