"""rSIM rewards: hand-computed planner/reasoner rewards, advantages, and follow cases."""

from __future__ import annotations

import math

import pytest

from collabrl.rewards.rsim import (
    PlannerReward,
    follow_share,
    follows,
    format_reward,
    group_advantages,
    planner_reward,
    repetition_penalty,
    terminal_reward,
)
from collabrl.strategies import STRATEGY_NAMES

# -- planner ----------------------------------------------------------------------------


def test_planner_reward_worked_example() -> None:
    # validation is chosen 2 of 4 times -> penalty -0.5; ends on terminal -> +1.
    reward = planner_reward(True, ["decomposition", "validation", "validation", "terminal"])
    assert reward == PlannerReward(accuracy=1.0, terminal=1.0, penalty=-0.5)
    assert reward.total == pytest.approx(1.5)


def test_planner_reward_wrong_and_not_terminal() -> None:
    # 3 distinct of 3 -> penalty -1/3; last is continuation -> -1; wrong -> 0.
    reward = planner_reward(False, ["deep thinking", "continuation", "validation"])
    assert reward.accuracy == 0.0
    assert reward.terminal == -1.0
    assert reward.penalty == pytest.approx(-1 / 3)
    assert reward.total == pytest.approx(-4 / 3)


def test_planner_reward_empty_episode() -> None:
    reward = planner_reward(True, [])
    assert (reward.accuracy, reward.terminal, reward.penalty) == (1.0, -1.0, 0.0)
    assert reward.total == 0.0


@pytest.mark.parametrize(
    ("strategies", "expected"),
    [
        ([], -1.0),
        (["terminal"], 1.0),
        (["terminal", "continuation"], -1.0),  # terminal not last
        (["continuation", "terminal"], 1.0),
    ],
)
def test_terminal_reward(strategies: list[str], expected: float) -> None:
    assert terminal_reward(strategies) == expected


@pytest.mark.parametrize(
    ("strategies", "expected"),
    [
        ([], 0.0),
        (["terminal"], -1.0),
        (["continuation"] * 4, -1.0),
        (["continuation", "continuation", "validation", "terminal", "summarization"], -0.4),
    ],
)
def test_repetition_penalty(strategies: list[str], expected: float) -> None:
    assert repetition_penalty(strategies) == pytest.approx(expected)


# -- reasoner ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2 + 3 = 5, so the answer is $\\boxed{5}$.", 1.0),
        ("\\boxed{\\frac{1}{2}}", 1.0),
        ("The answer is 5.", 0.0),  # no box
        ("\\boxed{}", 0.0),  # empty box
        ("\\boxed{5", 0.0),  # truncated box
        ("", 0.0),
    ],
)
def test_format_reward(text: str, expected: float) -> None:
    assert format_reward(text) == expected


def test_follow_share() -> None:
    steps = [
        ("validation", " we substitute x = 4 back: 2(4) + 3 = 11, which matches."),  # yes
        ("summarization", " 3 * 4 = 12."),  # no marker -> no
        ("continuation", " we add 5 and 7 to get 12."),  # yes
        ("terminal", " $\\boxed{12}$."),  # yes
    ]
    assert follow_share(steps) == pytest.approx(3 / 4)
    assert follow_share([]) == 0.0


def test_follows_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        follows("verification", "we check it.")
    with pytest.raises(ValueError, match="unknown strategy"):
        follow_share([("Validation", "we check it.")])  # names are case-sensitive


# Hand-labelled continuations a small model writes after each guidance lead-in of
# strategies.py (the lead-in itself is never part of the step).
FOLLOW_CASES: list[tuple[str, str, bool]] = [
    # "Looking back at the previous steps to check them for mistakes,"
    ("self-reflection", " in step 2 I added instead of multiplying, which was wrong.", True),
    ("self-reflection", " the previous steps look correct, so we keep x = 4.", True),
    ("self-reflection", " we made an error: 7 * 8 is 56, not 54.", True),
    ("self-reflection", " we multiply 12 by 3 to get 36.", False),
    # "Breaking the problem into smaller parts,"
    ("decomposition", " the first part is the apples, the second part the pears.", True),
    ("decomposition", " we split the trip into two legs: 60 km and 40 km.", True),
    ("decomposition", " there are two cases: x > 0 and x < 0.", True),
    ("decomposition", " 5 + 3 = 8.", False),
    # "Thinking carefully about what the problem requires,"
    ("deep thinking", " we need the total, because it asks for all the apples.", True),
    ("deep thinking", " an even number means it is divisible by 2.", True),
    ("deep thinking", " 36 / 4 = 9.", False),
    # "To verify the result so far,"
    ("validation", " we substitute x = 4 back: 2(4) + 3 = 11, which matches.", True),
    ("validation", " 12 * 3 = 36 and 36 / 3 = 12, so it is correct.", True),
    ("validation", " we double-checked the sum: 20 + 16 = 36.", True),
    ("validation", " we multiply 7 by 6 to get 42.", False),
    ("validation", " the next term is 3 * 9 = 27.", False),
    # "To summarize what we know so far,"
    ("summarization", " we know that John has 5 apples and Mary has 10.", True),
    ("summarization", " the train travels 120 km in 2 hours; we have its speed next.", True),
    ("summarization", " the area is 3 * 4 = 12.", False),
    ("summarization", " Mary gives away 4 of them.", False),
    # "Focusing on the most important part first,"
    ("prioritization", " the key quantity is the speed of the train.", True),
    ("prioritization", " we find the radius first, since everything else depends on it.", True),
    ("prioritization", " 12 + 8 = 20.", False),
    # "Next,"
    ("continuation", " we add 5 and 7 to get 12.", True),
    ("continuation", " 12*3=36", True),  # a calculation, even in one word
    ("continuation", " Ok.", False),
    ("continuation", "", False),
    # "To plan the next few steps,"
    ("sub-planning", " we will first find the radius, then compute the area.", True),
    ("sub-planning", " we need to find x, and then we can find y.", True),
    ("sub-planning", " first find the radius, then compute the area.", True),
    ("sub-planning", " the radius is 10 / 2 = 5.", False),
    # "So the final answer is"
    ("terminal", " $\\boxed{12}$.", True),
    ("terminal", " 12 apples.", True),
    ("terminal", " the sum of the two numbers.", False),
    ("terminal", "", False),
]  # fmt: skip


@pytest.mark.parametrize(("strategy", "step", "expected"), FOLLOW_CASES)
def test_follows_hand_labelled(strategy: str, step: str, expected: bool) -> None:
    assert follows(strategy, step) is expected


def test_follow_cases_cover_every_strategy() -> None:
    # At least one positive and one negative per strategy.
    for name in STRATEGY_NAMES:
        labels = {expected for strategy, _, expected in FOLLOW_CASES if strategy == name}
        assert labels == {True, False}, name


def test_follows_is_lexical() -> None:
    # Pinned limitations of the proxy (see the module docstring): an A.2 keyword common
    # in plain computation counts, and an unmarked genuine check does not.
    assert follows("summarization", " we simplify 6/8 to 3/4.")
    assert not follows("validation", " 2(4) + 3 = 11, the same as the right-hand side.")


# -- advantages -------------------------------------------------------------------------


def test_group_advantages_one_group() -> None:
    # mean 0.25; deviations 0.75, -0.25 x3; sample var (0.5625 + 3 * 0.0625) / 3 = 0.25.
    adv = group_advantages([1, 0, 0, 0], group_size=4)
    assert adv == pytest.approx([0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001])
    assert group_advantages([1, 0, 0, 0], 4, scale=False) == pytest.approx(
        [0.75, -0.25, -0.25, -0.25]
    )


def test_group_advantages_two_groups() -> None:
    # Group 1: mean 0.5, std sqrt(0.5); group 2: mean 2, std sqrt(2).
    adv = group_advantages([1, 0, 3, 1], group_size=2)
    s1, s2 = math.sqrt(0.5) + 1e-4, math.sqrt(2) + 1e-4
    assert adv == pytest.approx([0.5 / s1, -0.5 / s1, 1 / s2, -1 / s2])
    assert group_advantages([1, 0, 3, 1], 2, scale=False) == pytest.approx([0.5, -0.5, 1.0, -1.0])


def test_group_advantages_flat_group_is_zero() -> None:
    assert group_advantages([1, 0, 0, 0, 2, 2, 2, 2], 4)[4:] == [0.0, 0.0, 0.0, 0.0]


def test_group_advantages_group_of_one() -> None:
    adv = group_advantages([3.0, -1.0], group_size=1)
    assert adv == [0.0, 0.0]
    assert not any(math.isnan(a) for a in adv)


def test_group_advantages_empty() -> None:
    assert group_advantages([], 4) == []


@pytest.mark.parametrize(("rewards", "group_size"), [([1, 0, 0], 2), ([1, 0], 0), ([1], -1)])
def test_group_advantages_bad_group_size(rewards: list[float], group_size: int) -> None:
    with pytest.raises(ValueError):
        group_advantages(rewards, group_size)
