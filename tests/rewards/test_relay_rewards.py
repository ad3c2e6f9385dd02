"""RelayLLM's rewards (§3.2.3) against hand-computed values, one test per branch."""

import random

import pytest

from collabrl.rewards.relay import (
    Outcome,
    Scenario,
    difficulty_aware_reward,
    group_rewards,
    group_scenarios,
    per_call_ratio,
    scenario,
    simple_reward,
)

S1, S2, S3 = Scenario.STUDENT_SOLVABLE, Scenario.TEACHER_DEPENDENT, Scenario.TEACHER_UNSOLVABLE


@pytest.mark.parametrize(
    "correct, ratio, expected",
    [(True, 0.0, 1.0), (True, 0.25, 0.75), (False, 0.0, 0.0), (False, 0.25, -0.25)],
)
def test_simple_reward(correct: bool, ratio: float, expected: float) -> None:
    assert simple_reward(correct, ratio) == pytest.approx(expected)


def test_called_means_a_positive_ratio() -> None:
    assert Outcome(True, 0.01).called
    assert not Outcome(True, 0.0).called


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_outcome_rejects_a_ratio_outside_0_1(ratio: float) -> None:
    with pytest.raises(ValueError, match="call ratio"):
        Outcome(True, ratio)


@pytest.mark.parametrize(
    "group, expected",
    [
        ([Outcome(True, 0.0), Outcome(True, 0.5), Outcome(False, 0.0)], S1),
        ([Outcome(False, 0.0), Outcome(True, 0.5), Outcome(False, 0.2)], S2),
        ([Outcome(False, 0.0), Outcome(False, 0.5)], S3),
        ([Outcome(True, 0.0)], S1),
    ],
)
def test_scenario(group: list[Outcome], expected: Scenario) -> None:
    assert scenario(group) is expected


def test_scenario_of_an_empty_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        scenario([])


@pytest.mark.parametrize(
    "outcome, group_scenario, expected",
    [
        # Student-solvable: 1.5 independent, 1 − ρ dependent, 0 wrong (called or not).
        (Outcome(True, 0.0), S1, 1.5),
        (Outcome(True, 0.2), S1, 0.8),
        (Outcome(False, 0.0), S1, 0.0),
        (Outcome(False, 0.3), S1, 0.0),
        # Teacher-dependent: −1 without calling, 1 − ρ right with a call, 0 wrong with one.
        (Outcome(False, 0.0), S2, -1.0),
        (Outcome(True, 0.4), S2, 0.6),
        (Outcome(False, 0.4), S2, 0.0),
        # Teacher-unsolvable: exploration reward ρ for callers, 0 otherwise.
        (Outcome(False, 0.3), S3, 0.3),
        (Outcome(False, 0.0), S3, 0.0),
    ],
)
def test_difficulty_aware_reward(
    outcome: Outcome, group_scenario: Scenario, expected: float
) -> None:
    assert difficulty_aware_reward(outcome, group_scenario) == pytest.approx(expected)


def test_group_split_across_processes_is_decided_over_its_union() -> None:
    # Prompt "a": process 0 holds only wrong or calling samples (alone it would look
    # teacher-dependent); process 1 holds the sample that solved it without calling.
    slice_0 = [("a", Outcome(False, 0.0)), ("a", Outcome(True, 0.5)), ("b", Outcome(False, 0.0))]
    slice_1 = [("a", Outcome(True, 0.0)), ("b", Outcome(True, 0.25)), ("b", Outcome(False, 0.1))]
    batch = slice_0 + slice_1
    random.Random(0).shuffle(batch)

    rewards = group_rewards(batch, "difficulty_aware", "group")

    expected = {
        # "a" is student-solvable: wrong 0, dependent 1 − 0.5, independent 1.5.
        ("a", Outcome(False, 0.0)): 0.0,
        ("a", Outcome(True, 0.5)): 0.5,
        ("a", Outcome(True, 0.0)): 1.5,
        # "b" is teacher-dependent: non-caller −1, right caller 1 − 0.25, wrong caller 0.
        ("b", Outcome(False, 0.0)): -1.0,
        ("b", Outcome(True, 0.25)): 0.75,
        ("b", Outcome(False, 0.1)): 0.0,
    }
    assert rewards == pytest.approx([expected[sample] for sample in batch])
    assert group_scenarios(batch) == [S1 if key == "a" else S2 for key, _ in batch]
    # Process 0's share alone would have misjudged "a" and punished its non-caller.
    assert group_scenarios(slice_0)[0] is S2


def test_group_rewards_unsolvable_group_gets_exploration_rewards() -> None:
    batch = [("c", Outcome(False, 0.0)), ("c", Outcome(False, 0.4))]
    assert group_rewards(batch, "difficulty_aware", "group") == pytest.approx([0.0, 0.4])


def test_group_rewards_simple_ignores_groups() -> None:
    batch = [("a", Outcome(True, 0.0)), ("a", Outcome(True, 0.5)), ("b", Outcome(False, 0.2))]
    assert group_rewards(batch, "simple", "group") == pytest.approx([1.0, 0.5, -0.2])


def test_group_rewards_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown RelayLLM reward kind"):
        group_rewards([("a", Outcome(True, 0.0))], "accuracy", "group")  # type: ignore[arg-type]


def test_batch_scope_decides_one_scenario_over_every_group() -> None:
    """The released code's reading: "a" alone is teacher-dependent and "b" unsolvable,
    but "c" was solved without a call, so the whole batch is student-solvable."""
    batch = [
        ("a", Outcome(False, 0.0)),  # group: −1 (did not call); batch: 0 (wrong)
        ("a", Outcome(True, 0.25)),  # 1 − ρ either way
        ("b", Outcome(False, 0.5)),  # group: ρ (exploration); batch: 0 (wrong)
        ("c", Outcome(True, 0.0)),  # 1.5 either way
    ]
    assert group_rewards(batch, "difficulty_aware", "group") == pytest.approx(
        [-1.0, 0.75, 0.5, 1.5]
    )
    assert group_rewards(batch, "difficulty_aware", "batch") == pytest.approx([0.0, 0.75, 0.0, 1.5])
    # A batch of one group is scored alike under either scope; simple ignores the scope.
    one = [s for s in batch if s[0] == "a"]
    assert group_rewards(one, "difficulty_aware", "batch") == group_rewards(
        one, "difficulty_aware", "group"
    )
    assert group_rewards(batch, "simple", "batch") == group_rewards(batch, "simple", "group")


def test_group_rewards_rejects_an_unknown_scope() -> None:
    with pytest.raises(ValueError, match="unknown scenario scope 'prompt'"):
        group_rewards([("a", Outcome(True, 0.0))], "difficulty_aware", "prompt")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "calls, response_tokens, expected",
    [
        (0, 1000, 0.0),  # no call: ρ = 0 whatever the length
        (1, 1000, 0.5),  # 500 per call, whatever n the call asked for
        (2, 4000, 0.25),
        (3, 1000, 1.0),  # 1500 / 1000, clipped to 1
        (0, 0, 0.0),  # an empty response
    ],
)
def test_per_call_ratio_counts_a_fixed_cost_per_call(
    calls: int, response_tokens: int, expected: float
) -> None:
    assert per_call_ratio(calls, response_tokens, 500) == pytest.approx(expected)
    assert Outcome(True, per_call_ratio(calls, response_tokens, 500)).called == (calls > 0)
