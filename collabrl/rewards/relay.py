"""RelayLLM's rewards (paper §3.2.3): the simple reward and the difficulty-aware one.

Both score one sample from two plain values, whether its answer is right and its call
ratio ρ(y) ∈ [0, 1]. The difficulty-aware reward also needs the *scenario* of the
sample's prompt group, decided over every sample of that group, so a trainer scores a
batch with `group_rewards`, which groups the samples by prompt key itself.

Two readings of the released code (`math_help_group.py`) are offered beside the paper's
text, which stays the default: one scenario for the whole batch (`scope="batch"`; the
text decides it per prompt group, "the collective performance of the sampled group 𝒢"),
and ρ counted per call (`per_call_ratio`; the text counts "large-model generated tokens").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, get_args

# Scenario 1's "boosted bonus (r = 1.5) for independent success".
INDEPENDENT_SUCCESS_REWARD = 1.5
# Scenario 2's "penalty on samples that fail to call the teacher (r = −1.0 when ρ(y) = 0)".
STUBBORN_PENALTY = -1.0

RewardKind = Literal["simple", "difficulty_aware"]
# Where a scenario is decided: over each prompt group (the paper's text) or over the
# whole batch (the released code).
ScenarioScope = Literal["group", "batch"]
SCENARIO_SCOPES: tuple[str, ...] = get_args(ScenarioScope)
# Which ρ(y) the rewards charge: the teacher tokens realised (the paper's definition) or
# a fixed count per call (the released code).
CallRatioKind = Literal["realised", "per_call"]
CALL_RATIOS: tuple[str, ...] = get_args(CallRatioKind)


@dataclass(frozen=True)
class Outcome:
    """One sample, as the rewards see it: right or wrong, and its call ratio ρ(y)."""

    correct: bool
    call_ratio: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.call_ratio <= 1.0:
            raise ValueError(f"call ratio must be in [0, 1], got {self.call_ratio}")

    @property
    def called(self) -> bool:
        """The sample invoked the large model. The paper tells callers from non-callers by
        ρ alone ("dependent success (ρ(y) > 0)", "fail to call ... when ρ(y) = 0"), so a
        call that brought back no token does not count."""
        return self.call_ratio > 0.0


class Scenario(StrEnum):
    """A prompt group's difficulty, from the correctness of its samples (§3.2.3)."""

    STUDENT_SOLVABLE = "student_solvable"  # some sample is right without calling
    TEACHER_DEPENDENT = "teacher_dependent"  # right answers only among samples that called
    TEACHER_UNSOLVABLE = "teacher_unsolvable"  # no sample is right


def simple_reward(correct: bool, call_ratio: float) -> float:
    """Eq. (3): r_simple(y) = 1(a = g) − ρ(y): correctness, less the cost of calling."""
    return float(correct) - call_ratio


def per_call_ratio(calls: int, response_tokens: int, tokens_per_call: int) -> float:
    """ρ(y) as the released code counts it (`math_help_group.py`): every call costs
    `tokens_per_call` tokens whatever n it asked for (the code's 500), over the response
    length (every author's tokens), at most 1."""
    if response_tokens <= 0:
        return 0.0
    return min(calls * tokens_per_call / response_tokens, 1.0)


def scenario(group: Sequence[Outcome]) -> Scenario:
    """The scenario of one prompt group: all of its samples, not a slice of them.

    Scenario 1 "is identified if there exists at least one sample in the group 𝒢 that
    answers correctly *without* invoking the large model"; scenario 2 is when "correct
    answers appear *only* in samples that call the large model"; scenario 3 when "no
    sample in 𝒢 yields the correct answer".
    """
    if not group:
        raise ValueError("a prompt group needs at least one sample")
    if any(o.correct and not o.called for o in group):
        return Scenario.STUDENT_SOLVABLE
    if any(o.correct for o in group):
        return Scenario.TEACHER_DEPENDENT
    return Scenario.TEACHER_UNSOLVABLE


def difficulty_aware_reward(outcome: Outcome, group_scenario: Scenario) -> float:
    """The difficulty-aware reward of one sample whose group is in `group_scenario`.

    - Student-solvable: 1.5 for independent success; "dependent success (ρ(y) > 0) still
      receives the simple reward", 1 − ρ; "incorrect responses receive zero reward".
    - Teacher-dependent: −1 "when ρ(y) = 0" (such a sample is wrong, or the group would
      be student-solvable); "effective expert calling that leads to a correct answer is
      rewarded with r_simple", 1 − ρ. The text gives no value for a sample that called
      and was still wrong: it gets 0, as in the authors' released code
      (`math_help_group.py`: "做错的0", wrong ones 0), not r_simple = −ρ.
    - Teacher-unsolvable: "a small exploration reward (r = ρ(y)) to samples that
      attempted to call the large model", and 0 to the others.
    """
    if group_scenario is Scenario.STUDENT_SOLVABLE:
        if not outcome.correct:
            return 0.0
        if outcome.called:
            return simple_reward(True, outcome.call_ratio)
        return INDEPENDENT_SUCCESS_REWARD
    if group_scenario is Scenario.TEACHER_DEPENDENT:
        if not outcome.called:
            return STUBBORN_PENALTY
        return simple_reward(True, outcome.call_ratio) if outcome.correct else 0.0
    return outcome.call_ratio if outcome.called else 0.0


def group_scenarios(samples: Sequence[tuple[str, Outcome]]) -> list[Scenario]:
    """Each sample's group scenario, in input order; `samples` are (group key, outcome).

    Samples may come in any order, a group's samples need not be adjacent, and a group
    is decided over all of its samples here. A caller on several processes must gather
    the whole batch first: a group whose samples are split across processes is decided
    over their union, never over one process's share (which could miss the one sample
    that solved it alone).
    """
    groups: defaultdict[str, list[Outcome]] = defaultdict(list)
    for key, outcome in samples:
        groups[key].append(outcome)
    decided = {key: scenario(group) for key, group in groups.items()}
    return [decided[key] for key, _ in samples]


def group_rewards(
    samples: Sequence[tuple[str, Outcome]], kind: RewardKind, scope: ScenarioScope
) -> list[float]:
    """The reward of every sample of a gathered batch, in input order.

    `samples` are (group key, outcome) pairs, as for `group_scenarios`, whose gathering
    rule applies. `kind="simple"` ignores the groups (Eq. 3 scores each sample alone).
    `scope="batch"` decides one scenario over every sample, whatever its group, as the
    released code does; a caller on several processes then gathers the whole batch.
    """
    if scope not in SCENARIO_SCOPES:
        raise ValueError(f"unknown scenario scope {scope!r}; known: {', '.join(SCENARIO_SCOPES)}")
    if kind == "simple":
        return [simple_reward(o.correct, o.call_ratio) for _, o in samples]
    if kind == "difficulty_aware":
        keyed = samples if scope == "group" else [("batch", o) for _, o in samples]
        scenarios = group_scenarios(keyed)
        return [difficulty_aware_reward(o, s) for (_, o), s in zip(samples, scenarios, strict=True)]
    raise ValueError(f"unknown RelayLLM reward kind {kind!r}; known: simple, difficulty_aware")
