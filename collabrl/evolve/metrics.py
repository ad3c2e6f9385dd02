"""Per-round numbers of an evolve run, and its accuracy curve.

Round r's *candidate* numbers are over the candidates proposed in round r (did the
models improve?). Its *selected* numbers are over the answers the run would return
if it stopped after round r (one per rule in `select.SELECTORS`): selection runs
over every candidate of rounds 1..r, the whole shared state. `oracle_accuracy` is
the share of problems with at least one correct candidate in that state, the
ceiling any selection rule can reach. `verified` and `refuted` are the shares of
round r's candidates whose code, re-run, agreed or disagreed with their answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collabrl.data.benchmarks import Item
from collabrl.evolve.select import SELECTORS
from collabrl.evolve.state import REFUTED, UNKNOWN, VERIFIED, Candidate

CURVES = (
    "candidate_accuracy",
    "selected_score_accuracy",
    "selected_vote_accuracy",
    "selected_verified_accuracy",
)


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def round_summary(
    round_no: int, new: list[Candidate], pool: list[Candidate], items: list[Item], models: int
) -> dict[str, Any]:
    """Round `round_no`'s entry of state.json: what was selected, and how it scored."""
    by_problem: dict[str, list[Candidate]] = {item.id: [] for item in items}
    for c in pool:
        by_problem[c.problem_id].append(c)
    selected = {
        item.id: {rule: pick(by_problem[item.id]) for rule, pick in SELECTORS.items()}
        for item in items
    }
    reviews = [r for c in new for r in c.reviews]
    summary: dict[str, Any] = {
        "round": round_no,
        "candidates": len(new),
        "candidate_accuracy": _share([c.correct for c in new]),
        "accuracy_by_model": [
            _share([c.correct for c in new if c.model == k]) for k in range(models)
        ],
        "mean_score": sum(c.score for c in new) / len(new) if new else 0.0,
        "unknown_verdicts": _share([r.verdict == UNKNOWN for r in reviews]),
        "tool_calls": sum(len(c.checks) for c in new),
        "tool_errors": sum(check["error"] is not None for c in new for check in c.checks),
        # The rest are unverified: no code, a crash, no output, or `execute` off.
        "verified": _share([c.verdict == VERIFIED for c in new]),
        "refuted": _share([c.verdict == REFUTED for c in new]),
        "oracle_accuracy": _share([any(c.correct for c in by_problem[i.id]) for i in items]),
    }
    for rule in SELECTORS:
        correct = [i.is_correct(selected[i.id][rule]) for i in items]
        summary[f"selected_{rule}_accuracy"] = _share(correct)
    summary["selected"] = selected
    return summary


def plot_curve(rounds: list[dict[str, Any]], path: Path, title: str) -> None:
    """Accuracy against the round, one line per curve (the Agg backend: no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["round"] for r in rounds]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key in (*CURVES, "oracle_accuracy"):
        style = ":" if key == "oracle_accuracy" else "-"  # a ceiling, not a result
        label = key.removesuffix("_accuracy")
        ax.plot(xs, [r[key] for r in rounds], style, marker="o", label=label)
    ax.set_xticks(xs)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
