"""Every script in bench/ runs: a smoke run of each, in a subprocess, at its smallest.

The benches are code that nothing else imports, so an API change breaks them silently
(eval_throughput.py crashed for a while after the KV-cache keyword changed). Each
script in bench/ is a test case here, found by globbing, so a new bench without a
smoke setting below fails. A smoke run checks that the script exits 0 and prints its
ratio line(s); the numbers themselves mean nothing at these sizes. The cheapest three
run in the default suite (~16 s together: the default run has a 15-minute budget), the
rest with `-m slow`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
RATIO = r"\d+\.\d+ ?[x×]"  # a ratio as the scripts print it: 1.23x or 1.234×


@dataclass(frozen=True)
class Smoke:
    """How to run one bench at its smallest: its arguments ({model}: the tiny random
    model) and the lines (regular expressions, per line) its output must contain."""

    args: tuple[str, ...]
    prints: tuple[str, ...]
    slow: bool = False


SMOKES = {
    "decode_step.py": Smoke(
        ("--model", "{model}", "--contexts", "16", "--batch-sizes", "1,2", "--steps", "2"),
        (rf"^\s+2\s+[\d.]+\s+[\d.]+\s+{RATIO}$",),
    ),
    "engine_compare.py": Smoke(  # the transformers engine only: vLLM is not installed here
        ("--engines", "transformers", "--model", "{model}", "-P", "2", "--max-tokens", "4"),
        (rf"^transformers\s.*{RATIO}$",),
        slow=True,
    ),
    "eval_throughput.py": Smoke(
        (
            *("--model", "{model}", "-P", "2", "--max-tokens", "4", "--batch-sizes", "2"),
            *("--repeats", "1", "--wait-idle", "0", "--redo-disturbed", "0", "--step-profile"),
        ),
        (rf"^static B=2\s.*{RATIO}", rf"^continuous B=2\s.*{RATIO}", rf"ceiling\s+{RATIO}$"),
    ),
    "grpo_vs_trl.py": Smoke(
        (
            *("--model", "{model}", "--steps", "2", "--repeats", "1", "--prompts", "2"),
            *("--generations", "2", "--max-tokens", "16"),
        ),
        (rf"^ratio collab / trl per step: {RATIO}", rf"^ratio collab / trl peak RSS: {RATIO}"),
        slow=True,
    ),
    "library_swaps.py": Smoke(
        ("--rounds", "1", "--jobs", "2", "--sandbox-runs", "1"),
        (rf"^verifier: per job, 4 threads\s.*{RATIO}$", rf"^sandbox: one scan .*{RATIO}$"),
    ),
    "memory_estimate.py": Smoke(
        (
            *("--methods", "grpo", "--sizes", "small", "--prompts", "1"),
            *("--generations", "2", "--max-tokens", "8"),
        ),
        (r"^grpo · small: estimate [\d.]+ GiB, measured [\d.]+ GiB, ratio [\d.]+$",),
        slow=True,
    ),
    "relay_overhead.py": Smoke(
        (
            *("--model", "{model}", "--batch-sizes", "1", "--repeats", "1"),
            *("--max-tokens", "16", "--every", "8", "--n", "4"),
        ),
        (rf"^B=1: median overhead {RATIO}",),
        slow=True,
    ),
    "serve_throughput.py": Smoke(
        ("--model", "{model}", "--max-tokens", "4", "--repeats", "1", "--clients", "2"),
        (rf"ratio 3/1\s+{RATIO}", rf"throughput\s+{RATIO}"),
        slow=True,
    ),
    "step_cost.py": Smoke(
        (
            *("--model", "{model}", "--data", "arith_train", "--steps", "2", "--rounds", "1"),
            *("--prompts", "1", "--generations", "2", "--max-tokens", "8", "--micro-batch", "1"),
        ),
        (rf"^lora/8\s.*{RATIO}\s+{RATIO}$",),
        slow=True,
    ),
    "train_step.py": Smoke(
        (
            *("--relay-model", "{model}", "--helper", "{model}", "--steps", "2", "--rounds"),
            *("1", "--prompts", "1", "--generations", "2", "--max-tokens", "8", "--limit", "4"),
        ),
        (rf"^relay\s.*{RATIO}\s+{RATIO}",),
        slow=True,
    ),
}


def bench_cases() -> list:
    """One case per script in bench/, slow-marked as its smoke setting says; a script
    without one is a case that fails in the default run."""
    cases = []
    for script in sorted(p.name for p in BENCH.glob("*.py")):
        smoke = SMOKES.get(script)
        marks = [pytest.mark.slow] if smoke is not None and smoke.slow else []
        cases.append(pytest.param(script, marks=marks, id=script.removesuffix(".py")))
    return cases


def test_every_smoke_setting_names_a_bench() -> None:
    """A bench renamed or deleted leaves no stale setting behind."""
    assert set(SMOKES) <= {p.name for p in BENCH.glob("*.py")}


@pytest.mark.parametrize("script", bench_cases())
def test_bench_runs(script: str, tiny_model_dir: Path) -> None:
    smoke = SMOKES.get(script)
    assert smoke is not None, f"bench/{script} has no smoke setting in {Path(__file__).name}"
    args = [a.replace("{model}", str(tiny_model_dir)) for a in smoke.args]
    # One thread: the default suite runs beside other work on small machines, and a
    # smoke run's timing means nothing anyway.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"bench/{script} exited {done.returncode}:\n{output[-4000:]}"
    for pattern in smoke.prints:
        assert re.search(pattern, done.stdout, re.MULTILINE), (
            f"bench/{script} printed no line matching {pattern!r}:\n{done.stdout[-4000:]}"
        )
