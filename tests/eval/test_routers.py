"""RelayLLM's router baselines from paired student/teacher outcomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl import runs
from collabrl.errors import UserError
from collabrl.eval.routers import (
    Outcome,
    paired_outcomes,
    perfect_router,
    random_router,
    rate_for_accuracy,
    rate_for_call_ratio,
    router_table,
)

# Student right on 1 of 4 samples with 10 tokens each; teacher right on 3 with 30 each.
PAIRS = [
    (Outcome(True, 10), Outcome(True, 30)),
    (Outcome(False, 10), Outcome(True, 30)),
    (Outcome(False, 10), Outcome(True, 30)),
    (Outcome(False, 10), Outcome(False, 30)),
]


def test_random_router_end_points_are_the_two_models() -> None:
    alone = random_router(PAIRS, 0.0)
    assert (alone.accuracy, alone.call_ratio) == (0.25, 0.0)
    teacher = random_router(PAIRS, 1.0)
    assert (teacher.accuracy, teacher.call_ratio) == (0.75, 1.0)


def test_random_router_halfway_by_hand() -> None:
    point = random_router(PAIRS, 0.5)
    assert point.accuracy == pytest.approx(0.5)
    assert point.call_ratio == pytest.approx(60 / (20 + 60))  # 0.5·120 / (0.5·40 + 0.5·120)


def test_perfect_router_by_hand() -> None:
    point = perfect_router(PAIRS)
    # Samples 2-4 go to the teacher (the student got them wrong): 1 + 2 correct of 4.
    assert point.accuracy == 0.75 and point.routed == 0.75
    assert point.call_ratio == pytest.approx(90 / (10 + 90))


def test_rate_for_call_ratio_inverts_the_random_router() -> None:
    for rate in (0.0, 0.1, 0.37, 0.9, 1.0):
        ratio = random_router(PAIRS, rate).call_ratio
        assert rate_for_call_ratio(PAIRS, ratio) == pytest.approx(rate)


def test_rate_for_accuracy_and_out_of_reach() -> None:
    assert rate_for_accuracy(PAIRS, 0.5) == pytest.approx(0.5)
    assert rate_for_accuracy(PAIRS, 0.9) is None  # better than the teacher alone


def test_router_table_matches_a_collaborative_run() -> None:
    points = router_table(PAIRS, [("relay", 0.5, 0.05)], rates=(0.0, 1.0))
    names = [p.name for p in points]
    assert names == [
        "random router p=0.00",
        "random router p=1.00",
        "perfect router",
        "random @ call ratio of relay",
        "random @ accuracy of relay",
    ]
    assert points[3].call_ratio == pytest.approx(0.05)
    assert points[4].accuracy == pytest.approx(0.5)


def _run(folder: Path, rows: list[tuple[str, int, bool, int]]) -> Path:
    folder.mkdir()
    with runs.RecordWriter(folder / runs.SAMPLES) as writer:
        for item, sample, correct, tokens in rows:
            writer.write(
                {"item_id": item, "sample": sample, "correct": correct, "completion_tokens": tokens}
            )
    return folder


def test_pairs_come_from_the_runs_sample_files(tmp_path: Path) -> None:
    student = _run(tmp_path / "s", [("a", 0, True, 5), ("b", 0, False, 7), ("c", 0, True, 1)])
    teacher = _run(tmp_path / "t", [("b", 0, True, 20), ("a", 0, False, 9)])
    assert paired_outcomes(student, teacher) == [
        (Outcome(True, 5), Outcome(False, 9)),
        (Outcome(False, 7), Outcome(True, 20)),
    ]
    other = _run(tmp_path / "o", [("z", 0, True, 3)])
    with pytest.raises(UserError, match="share no"):
        paired_outcomes(student, other)
