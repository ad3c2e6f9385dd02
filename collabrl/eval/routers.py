"""RelayLLM's router baselines, computed from two finished runs: student alone, teacher alone.

A router sends each whole problem to one model. Given per-sample correctness and
token counts of both models on the same problems (sample j of the student paired
with sample j of the teacher):

- **random router** with routing rate p: each sample goes to the teacher with
  probability p. Expected accuracy `(1-p)·acc_S + p·acc_T`; expected call ratio
  `p·T_T / ((1-p)·T_S + p·T_T)`, T being total generated tokens.
- **perfect router**: a sample goes to the teacher exactly when the student gets it
  wrong ("directs only questions the SLM cannot solve to the large model").

The call ratio of a routed sample is all-teacher, so a router's call ratio is
directly comparable with a relay run's `call_ratio` (teacher tokens ÷ all tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collabrl.errors import UserError
from collabrl.eval.samples import read_samples


@dataclass(frozen=True)
class Outcome:
    correct: bool
    tokens: int


@dataclass(frozen=True)
class RouterPoint:
    name: str
    accuracy: float
    call_ratio: float
    routed: float  # fraction of samples sent to the teacher


def paired_outcomes(student: Path, teacher: Path) -> list[tuple[Outcome, Outcome]]:
    """(student, teacher) outcomes of every sample both runs finished."""
    s, t = _outcomes(student), _outcomes(teacher)
    keys = sorted(s.keys() & t.keys())
    if not keys:
        raise UserError(
            f"{student} and {teacher} share no (problem, sample) pairs",
            "run both on the same benchmark with the same --n",
        )
    return [(s[k], t[k]) for k in keys]


def _outcomes(run_dir: Path) -> dict[tuple[str, int], Outcome]:
    rows = read_samples(run_dir, needs=("completion_tokens",))
    if not rows:
        raise UserError(f"{run_dir} has no finished samples", "is it a `collab eval` run?")
    return {
        (r["item_id"], r["sample"]): Outcome(r["correct"], r["completion_tokens"]) for r in rows
    }


def random_router(pairs: list[tuple[Outcome, Outcome]], rate: float) -> RouterPoint:
    if not 0 <= rate <= 1:
        raise ValueError(f"routing rate must be in [0, 1], got {rate}")
    count = len(pairs)
    acc_s = sum(s.correct for s, _ in pairs) / count
    acc_t = sum(t.correct for _, t in pairs) / count
    tok_s = sum(s.tokens for s, _ in pairs)
    tok_t = sum(t.tokens for _, t in pairs)
    total = (1 - rate) * tok_s + rate * tok_t
    return RouterPoint(
        f"random router p={rate:.2f}",
        (1 - rate) * acc_s + rate * acc_t,
        rate * tok_t / total if total else 0.0,
        rate,
    )


def perfect_router(pairs: list[tuple[Outcome, Outcome]]) -> RouterPoint:
    routed = [not s.correct for s, _ in pairs]
    correct = sum(t.correct if r else s.correct for (s, t), r in zip(pairs, routed, strict=True))
    teacher_tokens = sum(t.tokens for (_, t), r in zip(pairs, routed, strict=True) if r)
    total = sum(t.tokens if r else s.tokens for (s, t), r in zip(pairs, routed, strict=True))
    return RouterPoint(
        "perfect router",
        correct / len(pairs),
        teacher_tokens / total if total else 0.0,
        sum(routed) / len(pairs),
    )


def rate_for_call_ratio(pairs: list[tuple[Outcome, Outcome]], call_ratio: float) -> float:
    """The random router's routing rate whose expected call ratio is `call_ratio`.

    Solves c = p·T_T / ((1-p)·T_S + p·T_T) for p.
    """
    tok_s = sum(s.tokens for s, _ in pairs)
    tok_t = sum(t.tokens for _, t in pairs)
    if call_ratio <= 0 or tok_t == 0:
        return 0.0
    if call_ratio >= 1 or tok_s == 0:
        return 1.0
    return call_ratio * tok_s / (tok_t * (1 - call_ratio) + call_ratio * tok_s)


def rate_for_accuracy(pairs: list[tuple[Outcome, Outcome]], accuracy: float) -> float | None:
    """The routing rate whose expected accuracy is `accuracy` (None: out of reach)."""
    acc_s = sum(s.correct for s, _ in pairs) / len(pairs)
    acc_t = sum(t.correct for _, t in pairs) / len(pairs)
    if acc_t == acc_s:
        return 0.0 if accuracy == acc_s else None
    rate = (accuracy - acc_s) / (acc_t - acc_s)
    return rate if 0 <= rate <= 1 else None


def router_table(
    pairs: list[tuple[Outcome, Outcome]],
    collab_runs: list[tuple[str, float, float]],
    rates: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0),
) -> list[RouterPoint]:
    """Router points: a random-router sweep, the perfect router, and for every
    collaborative run (name, accuracy, call ratio) the random router at the same call
    ratio (resource-matched) and at the same accuracy (performance-matched)."""
    points = [random_router(pairs, p) for p in rates]
    points.append(perfect_router(pairs))
    for name, accuracy, call_ratio in collab_runs:
        same_cost = random_router(pairs, rate_for_call_ratio(pairs, call_ratio))
        points.append(RouterPoint(f"random @ call ratio of {name}", *_values(same_cost)))
        rate = rate_for_accuracy(pairs, accuracy)
        if rate is not None:
            same_acc = random_router(pairs, rate)
            points.append(RouterPoint(f"random @ accuracy of {name}", *_values(same_acc)))
    return points


def _values(point: RouterPoint) -> tuple[float, float, float]:
    return point.accuracy, point.call_ratio, point.routed
