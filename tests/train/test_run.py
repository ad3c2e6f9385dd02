"""Tests for collabrl.train.run's pieces every trainer shares: the line a step reports and
the experiment trackers a run may report to."""

from __future__ import annotations

import pytest

from collabrl.errors import UserError
from collabrl.train.run import check_report_to, step_line, trackers


def test_a_step_line_shows_what_the_step_logged_with_time_and_eta() -> None:
    logs = {"reward": 0.25, "episodes/accuracy": 0.5, "episodes/call_ratio": 0.125, "x": 9}
    line = step_line(logs, step=3, max_steps=20, per_step=41.2)
    assert line == (
        "step 3/20 · reward 0.250 · accuracy 0.500 · call ratio 0.125 · 41.2 s/step · ETA 11m 40s"
    )


def test_a_step_line_of_a_loss_only_log() -> None:
    assert (
        step_line({"loss": 1.5}, 10, 10, 2.0) == "step 10/10 · loss 1.500 · 2.0 s/step · ETA 0m 00s"
    )


@pytest.mark.parametrize(
    ("report_to", "expected"),
    [
        ("none", []),
        ("tensorboard", ["tensorboard"]),
        (" tensorboard , none ", ["tensorboard", "none"]),
    ],
)
def test_trackers_read_a_comma_separated_list(report_to: str, expected: list[str]) -> None:
    assert trackers(report_to) == expected


@pytest.mark.parametrize(
    ("report_to", "problem"),
    [
        ("nowhere", "report_to 'nowhere' is not a tracker"),
        ("trackio,nowhere", "report_to"),
    ],
)
def test_unknown_or_missing_trackers_are_refused(report_to: str, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        check_report_to(report_to)
