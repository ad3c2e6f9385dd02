"""scripts/evidence/apollo_seeds.py: evolve's selection rules and GRPO with the tool
against the tool-less control, per seed and pooled over seeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from collabrl import runs
from collabrl.eval.metrics import ProblemSamples, summarize
from tests.eval.evidence import EVIDENCE, load_script
from tests.eval.test_report import _run

SCRIPT = EVIDENCE / "apollo_seeds.py"


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _problems(out: Path) -> None:
    rows = [{"id": f"q{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(3)]
    _write_jsonl(out / "test.jsonl", rows)


def _evolve(out: Path, seed: str, answers: dict[str, dict[str, str | None]]) -> None:
    """An evolve folder whose last round selected `answers[problem][rule]`."""
    rounds = [{"round": 1, "selected": {}}, {"round": 2, "selected": answers}]
    folder = out / f"evolve-seed{seed}"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"rounds": rounds}))


def _eval(folder: Path, right: list[bool]) -> None:
    """A greedy `collab eval` folder whose problem i is right when `right[i]`."""
    problems = [ProblemSamples(f"q{i}", [r], [float(r)], ["1"]) for i, r in enumerate(right)]
    _run(folder, "m", 1, summarize(problems), protocol="apollo")
    _write_jsonl(
        folder / runs.SAMPLES,
        [{"item_id": f"q{i}", "sample": 0, "correct": r} for i, r in enumerate(right)],
    )


def test_evolve_rules_are_graded_by_each_problem_and_pooled_over_seeds(tmp_path: Path) -> None:
    script = load_script("apollo_seeds")
    _problems(tmp_path)  # the answers: q0 1, q1 2, q2 3
    # Seed 0: verified right on all three, vote on q0 only, score on none (and a None).
    _evolve(
        tmp_path,
        "0",
        {
            "q0": {"score": "7", "vote": "1", "verified": "1"},
            "q1": {"score": None, "vote": "9", "verified": "2"},
            "q2": {"score": "0", "vote": "0", "verified": "3.0"},
        },
    )
    # Seed 1: vote right on q1 where verified is wrong: q1 averages to a tie.
    _evolve(
        tmp_path,
        "1",
        {
            "q0": {"score": "1", "vote": "1", "verified": "1"},
            "q1": {"score": "2", "vote": "2", "verified": "5"},
            "q2": {"score": "0", "vote": "0", "verified": "3"},
        },
    )
    tables = script.evolve_tables(tmp_path, ["0", "1"])
    assert "| 0 | 0.0000 | 0.3333 | 1.0000 |" in tables
    assert "| 1 | 0.6667 | 0.6667 | 0.6667 |" in tables
    # verified − vote per problem, averaged: q0 0, q1 (1 − 1) / 2 = 0, q2 +1.
    assert "| verified vs vote | 3 | 0.3333 | 1 | 0 | 1.0000 | 1/2 |" in tables
    # verified − score: q0 (1 + 0) / 2, q1 (1 − 1) / 2 = 0, q2 +1.
    assert "| verified vs score | 3 | 0.5000 | 2 | 0 | 0.5000 | 1/2 |" in tables


def test_grpo_arms_per_seed_and_pooled(tmp_path: Path) -> None:
    script = load_script("apollo_seeds")
    finals = {
        ("grpo", "0"): [True, True, False],
        ("grpo", "1"): [True, True, True],
        ("grpo-alone", "0"): [False, True, False],
        ("grpo-alone", "1"): [True, False, False],
    }
    for (prefix, seed), right in finals.items():
        _eval(tmp_path / "rl" / f"{prefix}-seed{seed}" / "eval-final", right)
    _eval(tmp_path / "rl" / "grpo-seed0" / "eval-start", [True, False, False])
    _eval(tmp_path / "rl" / "grpo-alone-seed0" / "eval-start", [False, False, False])
    tables = script.grpo_tables(tmp_path, ["0", "1"])
    assert "| start (warm-up policy) | 0.3333 | 0.0000 |" in tables
    assert "| seed 0 | 0.6667 | 0.3333 |" in tables
    assert "| seed 1 | 1.0000 | 0.3333 |" in tables
    # tools − alone: q0 (1 + 0) / 2, q1 (0 + 1) / 2, q2 (0 + 1) / 2: three higher.
    assert "| tools vs alone | 3 | 0.5000 | 3 | 0 | 0.2500 | 2/2 |" in tables


def test_a_seed_not_finished_is_one_line(tmp_path: Path) -> None:
    _problems(tmp_path)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "evolve", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().startswith("error: ")
    assert "evolve-seed0" in done.stderr and "Traceback" not in done.stderr
