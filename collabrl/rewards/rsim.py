"""rSIM's rule-based rewards (paper §4.1, appendix A.6) and its strategy-follow detector.

Planner: R^p = R_acc + R_terminal + R_penalty, where R_terminal is +1 when the last
chosen strategy is "terminal" (−1 otherwise) and R_penalty is minus the share of the
most frequent strategy among the episode's choices. Reasoner: R = R_acc + R_format +
R_follow, where R_format checks for a `\\boxed{}` answer and R_follow is the share of
guided steps that follow their strategy. `group_advantages` turns one group's rewards
into GRPO advantages, as TRL computes them.

What `follows` measures, and what it does not: the paper does not say how "a step
follows the plan" is decided, so this is our lexical proxy. It looks only at the
reasoner's own continuation of a guided step (never at the guidance lead-in, which
holds keywords itself) and asks whether the text carries *markers* of the strategy:
the appendix A.2 keywords of that strategy, inflected exactly as `count_strategies`
matches them, or a short list of cue phrases of ours (`_CUES`) that a reader would
take as doing that strategy ("matches", "so far", "we will", "because", ...).
Continuation counts when the step makes any progress (a calculation or three words),
terminal when an answer can be extracted from the step. It does NOT check that the
reasoning actually did the strategy: "this is correct" passes validation even when
nothing was verified, and a genuine check phrased without any marker fails. A.2's
lists also hold words common in plain computation ("simplify", "evaluate"), so a
computing step may count as summarization or deep thinking. Treat R_follow as a cheap
shaping signal a policy can learn to game by word choice, not as a judge of reasoning.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from collabrl.rewards.extract import extract_answer
from collabrl.strategies import KEYWORDS, STRATEGY_NAMES, keyword_pattern

# -- planner ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannerReward:
    """The planner's reward of one episode, in the paper's three parts."""

    accuracy: float
    terminal: float
    penalty: float

    @property
    def total(self) -> float:
        return self.accuracy + self.terminal + self.penalty


def terminal_reward(strategies: Sequence[str]) -> float:
    """+1 when the planner ended on "terminal", −1 otherwise.

    An episode with no strategy at all never chose to stop, so it gets −1 too.
    """
    return 1.0 if strategies and strategies[-1] == "terminal" else -1.0


def repetition_penalty(strategies: Sequence[str]) -> float:
    """Minus the share of the most frequent strategy: it pushes the planner to vary.

    0 with no strategy (nothing was repeated); −1 when one strategy was used throughout.
    """
    if not strategies:
        return 0.0
    most = Counter(strategies).most_common(1)[0][1]
    return -most / len(strategies)


def planner_reward(correct: bool, strategies: Sequence[str]) -> PlannerReward:
    """R^p of one episode: accuracy of the reasoner's answer, terminal and penalty."""
    return PlannerReward(
        accuracy=1.0 if correct else 0.0,
        terminal=terminal_reward(strategies),
        penalty=repetition_penalty(strategies),
    )


# -- reasoner ---------------------------------------------------------------------------


def format_reward(reasoner_text: str) -> float:
    """1 when the reasoner's own text boxes a final answer (GRPO's format reward)."""
    return 1.0 if extract_answer(reasoner_text, ("boxed",)) is not None else 0.0


# Our cue phrases per keyword strategy (regex fragments, matched case-insensitively as
# whole words/phrases). They catch how small models actually phrase a strategy, which
# the A.2 verb lists miss ("which matches", "we know that", "because").
_CUES: dict[str, tuple[str, ...]] = {
    "self-reflection": (
        r"previous(?:\s+steps?)?", r"earlier", r"above", r"mistakes?", r"errors?",
        r"wrong", r"incorrect(?:ly)?", r"re-?check\w*", r"looking\s+back", r"should\s+have",
        r"(?:is|are|was|were|seems?|looks?)\s+correct",
    ),
    "decomposition": (
        r"first", r"second", r"third", r"parts?", r"cases?", r"sub-?problems?",
        r"pieces?", r"components?", r"step\s+\d+",
    ),
    "deep thinking": (
        r"because", r"since", r"means?", r"requires?", r"why", r"asks?", r"note\s+that",
        r"notice", r"in\s+other\s+words", r"implies", r"therefore", r"the\s+question",
    ),
    "validation": (
        r"checks?", r"match(?:es)?", r"(?:is|are)\s+correct", r"indeed", r"substitut\w*",
        r"plug\w*", r"back\s+into", r"consistent", r"holds", r"satisf(?:y|ies)", r"as\s+expected",
    ),
    "summarization": (
        r"so\s+far", r"we\s+know", r"we\s+have", r"we\s+found", r"in\s+summary",
        r"to\s+recap", r"overall", r"in\s+short", r"given\s+that",
    ),
    "prioritization": (
        r"most\s+important", r"key", r"first", r"main", r"crucial", r"essential",
        r"priority", r"focus\w*", r"start\s+(?:with|by)", r"begin\s+(?:with|by)",
    ),
    "sub-planning": (
        r"we\s+will", r"we'll", r"we\s+need\s+to", r"then\s+we", r"we\s+should",
        r"after\s+that", r"next\s+we", r"first\b.*?\bthen", r"steps?\s+(?:are|is)",
    ),
}  # fmt: skip

# One regex per keyword strategy: its A.2 keywords (built as `count_strategies` builds
# them, so "verified", "broke down" count) or one of its cue phrases.
_FOLLOW_RES: dict[str, re.Pattern[str]] = {
    name: re.compile(
        rf"\b(?:{'|'.join([*map(keyword_pattern, KEYWORDS[name]), *_CUES[name]])})\b",
        re.IGNORECASE | re.DOTALL,
    )
    for name in _CUES
}
# A calculation: a digit and an operator or "=" somewhere in the step.
_DIGIT_RE = re.compile(r"\d")
_OPERATOR_RE = re.compile(r"[-+*/×÷^=]")
_MIN_PROGRESS_WORDS = 3  # fewer words than this ("Ok.", "Hmm") is no step at all


def _makes_progress(step: str) -> bool:
    """Continuation asks only for a next step: a calculation or a few words of one."""
    has_calculation = bool(_DIGIT_RE.search(step) and _OPERATOR_RE.search(step))
    return has_calculation or len(step.split()) >= _MIN_PROGRESS_WORDS


def follows(strategy: str, step: str) -> bool:
    """Whether the reasoner's continuation `step` shows markers of `strategy`.

    `step` must be the reasoner's own text only, without the guidance lead-in (whose
    keywords would make every step follow). A lexical proxy: see the module docstring.
    Raises ValueError for a name not in STRATEGY_NAMES (a caller bug, not a miss).
    """
    if strategy not in STRATEGY_NAMES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGY_NAMES)}")
    if strategy == "continuation":
        return _makes_progress(step)
    if strategy == "terminal":
        # After "So the final answer is", stating the answer is the whole strategy.
        methods = ("boxed", "answer_line", "last_number")
        return extract_answer(step, methods) is not None
    return _FOLLOW_RES[strategy].search(step) is not None


def follow_share(steps: Sequence[tuple[str, str]]) -> float:
    """R_follow: the share of (strategy, step) pairs whose step follows its strategy.

    0 with no guided step: there is nothing the reasoner followed.
    """
    if not steps:
        return 0.0
    return sum(follows(strategy, step) for strategy, step in steps) / len(steps)


# -- advantages -------------------------------------------------------------------------

_STD_EPS = 1e-4  # TRL's GRPOTrainer: (r - mean) / (std + 1e-4)


def group_advantages(rewards: Sequence[float], group_size: int, scale: bool = True) -> list[float]:
    """GRPO advantages of consecutive groups of `group_size` rewards, as TRL computes them.

    Each reward minus its group's mean, divided by (unbiased std + 1e-4) when `scale`.
    A group of one has no spread (torch gives NaN there); we take std 0, so its
    advantage is 0. Raises ValueError for group_size < 1 or a ragged last group.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    advantages: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = [float(r) for r in rewards[start : start + group_size]]
        mean = statistics.fmean(group)
        std = statistics.stdev(group) if group_size > 1 else 0.0
        scale_by = std + _STD_EPS if scale else 1.0
        advantages.extend((r - mean) / scale_by for r in group)
    return advantages
