"""AlphaApollo evidence: tool use on held-out evaluations, as a table.

    python scripts/evidence/tools.py EVAL_DIR...

prints one markdown row per evaluation folder (`collab eval run`, or a training run's
eval-start/eval-final): accuracy, the share of answers that called a tool, tool calls
per answer, the share of calls that failed, accuracy over the answers that used a
tool and over those that did not (the paper's Figure 7 split).
"""

import json
import sys
from pathlib import Path

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


print("| eval | " + " | ".join(KEYS) + " |")
print("|" + " --- |" * (len(KEYS) + 1))
for path in sys.argv[1:]:
    folder = Path(path)
    metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    cells = [cell(metrics.get(key)) for key in KEYS]
    print(f"| {folder.parent.name}/{folder.name} | " + " | ".join(cells) + " |")
