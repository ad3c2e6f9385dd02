"""AlphaApollo evidence: tool use on held-out evaluations, as a table.

    python scripts/evidence/tools.py EVAL_DIR...

prints one markdown row per evaluation folder (`collab eval run`, or a training run's
eval-start/eval-final): accuracy, the share of answers that called a tool, tool calls
per answer, the share of calls that failed, accuracy over the answers that used a
tool and over those that did not (the paper's Figure 7 split), and the share right with
an answer that is a number: math-verify also counts an unevaluated expression of the
problem (`\\boxed{36 × 15}` for 540) as right.
"""

import json
import re
import sys
from pathlib import Path

from collabrl.rewards.verify import normalize

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

KEYS = (
    "pass@1",
    "tool_use_rate",
    "tool_calls_per_sample",
    "tool_call_error_rate",
    "accuracy_with_tools",
    "accuracy_without_tools",
)


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def right_as_number(folder: Path) -> float:
    lines = (folder / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    samples = [json.loads(line) for line in lines]
    numbers = [s["correct"] and NUMBER.fullmatch(normalize(s["answer"] or "")) for s in samples]
    return sum(bool(n) for n in numbers) / len(samples)


print("| eval | " + " | ".join(KEYS) + " | right, as a number |")
print("|" + " --- |" * (len(KEYS) + 2))
for path in sys.argv[1:]:
    folder = Path(path)
    metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    cells = [cell(metrics.get(key)) for key in KEYS] + [cell(right_as_number(folder))]
    print(f"| {folder.parent.name}/{folder.name} | " + " | ".join(cells) + " |")
