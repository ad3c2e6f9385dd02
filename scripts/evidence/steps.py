"""Evidence curves as a table: training metrics of each run, averaged over windows of steps.

    python scripts/evidence/steps.py KEY1,KEY2 WINDOW RUN...

prints one markdown row per run and window of WINDOW steps (1-4, 5-8, …): the mean of each
key of metrics.jsonl (TRL's log lines; evaluation lines are skipped). A key a run does not
log reads "-". Windows smooth the batch noise of a few episodes per step.
"""

import json
import sys
from pathlib import Path


def steps(run: Path) -> list[dict]:
    """The run's training log lines, in step order (one per step: the last one logged)."""
    lines = [json.loads(line) for line in open(run / "metrics.jsonl", encoding="utf-8")]
    by_step = {r["step"]: r for r in lines if "step" in r and "loss" in r}
    return [by_step[s] for s in sorted(by_step)]


def mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f}" if values else "-"


keys, window, runs = sys.argv[1].split(","), int(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
print("| run | steps | " + " | ".join(keys) + " |")
print("| --- | --- | " + " | ".join("---" for _ in keys) + " |")
for run in runs:
    logged = steps(run)
    for start in range(0, len(logged), window):
        part = logged[start : start + window]
        cells = [mean([r[k] for r in part if k in r]) for k in keys]
        span = f"{part[0]['step']}-{part[-1]['step']}"
        print(f"| {run.name} | {span} | " + " | ".join(cells) + " |")
