"""rSIM evidence: what the planner chose on a held-out evaluation, as a table.

    python scripts/evidence/plans.py EVAL_DIR...

prints one markdown row per evaluation folder (`collab eval run --protocol strategy`, or
a training run's eval-start/eval-final): accuracy, strategies per episode, the share of
each strategy among all choices, the entropy of those shares (0: one strategy only;
ln 9 = 2.20: all nine equally), the distinct plans (ordered strategy lists) among the
episodes, and why episodes ended.
"""

import json
import math
import sys
from collections import Counter
from pathlib import Path

from collabrl.strategies import STRATEGY_NAMES
from collabrl.train.rsim import END_REASONS

SHORT = {"deep thinking": "deep", "self-reflection": "reflect", "sub-planning": "subplan"}


def plans(folder: Path) -> tuple[list[list[str]], list[str], list[bool]]:
    lines = (folder / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    samples = [json.loads(line) for line in lines]
    chosen = [s["episode"]["meta"].get("strategies", []) for s in samples]
    return chosen, [s["episode"]["end"] for s in samples], [s["correct"] for s in samples]


def entropy(counts: Counter) -> float:
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values() if c)


names = [SHORT.get(s, s) for s in STRATEGY_NAMES]
ends = [f"end {e}" for e in END_REASONS]
header = ["eval", "accuracy", "strategies / episode", *names, "entropy", "plans", *ends]
print("| " + " | ".join(header) + " |")
print("|" + " --- |" * len(header))
for path in sys.argv[1:]:
    folder = Path(path)
    chosen, ends, correct = plans(folder)
    counts = Counter(name for row in chosen for name in row)
    total = sum(counts.values())
    ended = Counter(ends)
    cells = [f"{sum(correct) / len(correct):.3f}", f"{total / len(chosen):.2f}"]
    cells += [f"{counts[s] / max(total, 1):.2f}" for s in STRATEGY_NAMES]
    cells += [f"{abs(entropy(counts)):.2f}", str(len({tuple(row) for row in chosen}))]
    cells += [f"{ended[e] / len(ends):.2f}" for e in END_REASONS]
    print(f"| {folder.parent.name}/{folder.name} | " + " | ".join(cells) + " |")
