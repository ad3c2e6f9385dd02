"""What rSIM's planner sees of a solution: its masked view (`PlannerContext`) and f_obs.

The strategy set itself, and its keyword counting, sit on the base floor in
`collabrl.strategies`; both the `strategy` protocol and the planners build on this
module, which imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannerContext:
    """The planner's masked view (rSIM appendix A.7): the question and f_obs of each step.

    It never holds the reasoner's partial current step, nor past guidance.
    """

    question: str
    steps: tuple[str, ...] = ()


def observe_step(text: str, summary_chars: int) -> str:
    """f_obs: a finished step collapsed to one line, cut to `summary_chars` (0: whole).

    A long step keeps its head and its tail, joined by " … ": the head says what the
    step set out to do, the tail what it found.
    """
    line = " ".join(text.split())
    if summary_chars <= 0 or len(line) <= summary_chars:
        return line
    keep = summary_chars - 3
    head, tail = keep - keep // 2, keep // 2
    return f"{line[:head].rstrip()} … {line[len(line) - tail :].lstrip()}"
