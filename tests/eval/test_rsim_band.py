"""scripts/evidence/rsim_band.py (the candidates within a band of pass rates under a
protocol) and scripts/evidence/rsim_groups.py (the training groups where R_acc varies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl import runs
from tests.eval.evidence import load_script


def _lines(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# problem -> its samples' correctness: pass rates 1, 0.5, 0.25 and 0 over k = 4
CORRECT = {"a": [1, 1, 1, 1], "b": [1, 0, 1, 0], "c": [0, 0, 1, 0], "d": [0, 0, 0, 0]}


@pytest.fixture
def candidates(tmp_path: Path) -> Path:
    path = tmp_path / "candidates.jsonl"
    rows = [
        {"id": i, "problem": f"What is {n}?", "answer": str(n), "family": f"f{n}"}
        for n, i in enumerate(CORRECT)
    ]
    _lines(path, rows)
    return path


def _eval_run(folder: Path, correct: dict[str, list[int]]) -> Path:
    """A `collab eval run` folder's samples.jsonl: sample s of problem i right iff 1."""
    folder.mkdir()
    records = [
        {"item_id": i, "sample": s, "correct": bool(c)}
        for i, values in correct.items()
        for s, c in enumerate(values)
    ]
    _lines(folder / runs.SAMPLES, records)
    return folder


def test_the_band_keeps_the_candidates_rows_within_both_bounds(
    candidates: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script("rsim_band")
    run = _eval_run(tmp_path / "eval", CORRECT)
    out = tmp_path / "train.jsonl"

    script.main([str(candidates), str(run), "4", "0.25", "0.5", str(out)])

    kept = runs.read_records(out)
    assert [(r["id"], r["family"], r["pass_rate"]) for r in kept] == [
        ("b", "f1", 0.5),
        ("c", "f2", 0.25),
    ]
    assert "2 of 4 problems" in capsys.readouterr().out


def test_a_problem_with_fewer_than_k_samples_is_refused(candidates: Path, tmp_path: Path) -> None:
    script = load_script("rsim_band")
    run = _eval_run(tmp_path / "eval", {**CORRECT, "d": [0, 0]})  # an eval run with --n 2

    with pytest.raises(SystemExit, match="1 problems have fewer than 4 samples"):
        script.band(candidates, run, 4, 0.25, 0.5)


def test_a_band_upside_down_is_refused(candidates: Path, tmp_path: Path) -> None:
    from collabrl.errors import UserError

    script = load_script("rsim_band")
    with pytest.raises(UserError, match="max_threshold"):
        script.band(candidates, _eval_run(tmp_path / "eval", CORRECT), 4, 0.6, 0.2)


def _rollouts(run: Path, steps: dict[int, dict[str, list[int]]]) -> Path:
    """A training run's rollouts.jsonl: at each step, each problem's episodes' correctness."""
    run.mkdir()
    records = [
        {"step": step, "correct": bool(c), "episode": {"problem_id": problem}}
        for step, found in steps.items()
        for problem, values in found.items()
        for c in values
    ]
    _lines(run / "rollouts.jsonl", records)
    return run


def test_groups_count_the_ones_with_right_and_wrong_episodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script("rsim_groups")
    # Step 1: one mixed group of two; step 2: both mixed (the same problem again is a new group).
    run = _rollouts(
        tmp_path / "joint-seed0",
        {1: {"a": [1, 0], "b": [0, 0]}, 2: {"a": [1, 1], "c": [0, 1]}},
    )
    run2 = _rollouts(tmp_path / "joint-seed1", {1: {"a": [1, 0]}, 2: {"a": [0, 1]}})

    script.main([str(run), str(run2)])

    table = capsys.readouterr().out.splitlines()
    assert "| joint-seed0 · all | 4 | 2 (0.50) | 0.500 |" in table
    assert "| joint-seed0 · steps < 2 | 2 | 1 (0.50) | 0.250 |" in table
    assert "| joint-seed0 · steps ≥ 2 | 2 | 1 (0.50) | 0.750 |" in table
    assert "| joint-seed1 · all | 2 | 2 (1.00) | 0.500 |" in table


def test_groups_cut_by_save_rollouts_are_refused(tmp_path: Path) -> None:
    script = load_script("rsim_groups")
    run = _rollouts(tmp_path / "joint-seed0", {1: {"a": [1, 0], "b": [0]}})

    with pytest.raises(SystemExit, match="raise save_rollouts"):
        script.main([str(run)])


def _record(root: Path, correct: dict[str, float], n: int) -> Path:
    """An evidence record (rsim-band/pass-rates/seed-0.json) whose evaluation `train`
    sampled n a problem with these pass rates."""
    path = root / "rsim-band" / "pass-rates" / "seed-0.json"
    path.parent.mkdir(parents=True)
    summary = {"n": n, "problems": len(correct), "accuracy": 0.5, "correct": correct}
    summary["call_share"] = {}
    record = {"schema": 1, "method": "rsim-band", "arm": "pass-rates", "seed": 0}
    record |= {"commit": None, "config_hash": "h", "wall_time_s": None, "curve": []}
    path.write_text(json.dumps(record | {"evals": {"train": summary}}))
    return path


def test_the_band_from_a_record_is_the_band_from_its_run(candidates: Path, tmp_path: Path) -> None:
    script = load_script("rsim_band")
    rates = {i: sum(values) / 4 for i, values in CORRECT.items()}
    record = _record(tmp_path / "evidence", rates, 4)

    from_record = script.band(candidates, f"{record}:train", 4, 0.25, 0.5)
    from_run = script.band(candidates, str(_eval_run(tmp_path / "eval", CORRECT)), 4, 0.25, 0.5)

    assert from_record == from_run
    assert [r["id"] for r in from_record] == ["b", "c"]


@pytest.mark.parametrize(
    ("source", "k", "message"),
    [
        ("{record}:test", 4, "has no evaluation 'test'"),
        ("{record}:train", 8, "sampled 4 a problem, not 8"),
    ],
)
def test_a_record_of_another_evaluation_is_refused(
    candidates: Path, tmp_path: Path, source: str, k: int, message: str
) -> None:
    script = load_script("rsim_band")
    record = _record(tmp_path / "evidence", {i: 0.5 for i in CORRECT}, 4)

    with pytest.raises(SystemExit, match=message):
        script.band(candidates, source.format(record=record), k, 0.25, 0.5)


def test_a_record_missing_candidates_is_refused(candidates: Path, tmp_path: Path) -> None:
    script = load_script("rsim_band")
    record = _record(tmp_path / "evidence", {"a": 1.0, "b": 0.5}, 4)

    with pytest.raises(SystemExit, match="2 candidates have no pass rate"):
        script.band(candidates, f"{record}:train", 4, 0.25, 0.5)
