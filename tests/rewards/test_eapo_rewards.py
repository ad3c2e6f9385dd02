"""EAPO's reward (§2.1) and its format check against hand-computed values."""

import pytest

from collabrl.rewards.eapo import eapo_reward, format_ok
from collabrl.rewards.f1 import token_f1


@pytest.mark.parametrize(
    "f1, ok, expected",
    [
        (0.5, True, 0.5),  # F1 not 0: the F1 itself, format or not
        (0.5, False, 0.5),
        (1.0, True, 1.0),
        (0.0, True, 0.1),  # F1 0 with correct format
        (0.0, False, 0.0),  # otherwise
    ],
)
def test_eapo_reward_branches(f1: float, ok: bool, expected: float) -> None:
    assert eapo_reward(f1, ok) == pytest.approx(expected)


@pytest.mark.parametrize(
    "f1, ok, penalty, calls, expected",
    [
        (0.5, True, 0.05, 2, 0.4),
        (0.0, True, 0.05, 3, -0.05),
        (0.0, False, 0.1, 1, -0.1),
        (1.0, True, 0.1, 0, 1.0),  # no consultation, no penalty
        (1.0, True, 0.0, 4, 1.0),  # off by default
    ],
)
def test_eapo_reward_consultation_penalty(
    f1: float, ok: bool, penalty: float, calls: int, expected: float
) -> None:
    assert eapo_reward(f1, ok, penalty=penalty, calls=calls) == pytest.approx(expected)


@pytest.mark.parametrize(
    "f1, penalty, calls", [(-0.1, 0.0, 0), (1.1, 0.0, 0), (0.5, -0.1, 1), (0.5, 0.1, -1)]
)
def test_eapo_reward_rejects_bad_inputs(f1: float, penalty: float, calls: int) -> None:
    with pytest.raises(ValueError):
        eapo_reward(f1, True, penalty=penalty, calls=calls)


def test_eapo_reward_with_token_f1() -> None:
    # "The answer is 204" against 204: P = 1/3, R = 1, F1 = 0.5.
    assert eapo_reward(token_f1("The answer is 204", "204"), True) == pytest.approx(0.5)
    assert eapo_reward(token_f1("205", "204"), format_ok("Answer: 205")) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>easy</think>\nAnswer: 42", True),
        ("Answer: 42\n\n", True),  # trailing blank lines are not a last line
        ("**Answer:** $\\frac{1}{2}$", True),
        ("Final Answer: \\boxed{7}", True),
        ("Answer: 42\nI hope this helps.", False),  # not in the last line
        ("The result is 42.", False),  # no marker
        ("Answer:", False),  # empty answer
        ("Answer: \\boxed{7", False),  # unclosed box: no answer
        ("", False),
    ],
)
def test_format_ok(text: str, expected: bool) -> None:
    assert format_ok(text) is expected
