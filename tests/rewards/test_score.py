"""One scorer for every run: equivalence by math-verify, partial credit by token F1."""

from __future__ import annotations

import pytest

from collabrl.rewards.score import score_answer


@pytest.mark.parametrize(
    ("answer", "gold", "correct", "f1"),
    [
        ("1/2", "0.5", True, 1.0),  # equivalent, and one number to F1
        ("\\frac{1}{2}", "0.5", True, 0.0),  # equivalent, but no token in common
        ("The answer is 204", "204", True, 0.5),  # F1's partial credit for the extra words
        ("-5", "5", False, 0.0),  # the sign counts in both
        (None, "7", False, 0.0),  # no answer
    ],
)
def test_an_answer_is_scored_by_equivalence_and_token_f1(answer, gold, correct, f1) -> None:
    score = score_answer(answer, gold)
    assert score == {"answer": answer, "gold": gold, "correct": correct, "f1": pytest.approx(f1)}
