"""Evidence data for rSIM: the candidate problems the reasoner solves sometimes.

`collab filter` asks a model one prompt; rSIM's reasoner answers under the strategy
protocol (a planner's guidance before every step, the step and episode budgets), and
its pass rate there is what gives R_acc a group variance. So the pass rates come from
`collab eval run CANDIDATES --protocol strategy --n K` at the rollout settings, and
this script keeps the candidates whose pass rate over those K samples is within
[LOW, HIGH], by `collab filter`'s own rule (`builders.filter.pass_rates`: every one of
the K samples scored, both bounds kept). The kept rows are the candidates' own rows
(family and all) with their pass rate, written to OUT; a summary goes to stdout.

    python scripts/evidence/rsim_band.py CANDIDATES.jsonl EVAL_RUN 8 0.2 0.6 OUT.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from collabrl.builders.filter import FilterConfig, pass_rates
from collabrl.data.benchmarks import load_benchmark
from collabrl.runs import SAMPLES, read_records


def band(candidates: Path, eval_run: Path, k: int, low: float, high: float) -> list[dict]:
    """The candidate rows whose pass rate in `eval_run` is within [low, high]."""
    config = FilterConfig(teacher=str(eval_run), k=k, threshold=low, max_threshold=high)
    config.check()  # the same bounds `collab filter` accepts
    items = load_benchmark(str(candidates)).items
    rates = {r["item_id"]: r for r in pass_rates(items, read_records(eval_run / SAMPLES), config)}
    incomplete = [i for i, r in rates.items() if r["k"] < k]
    if incomplete:
        # An eval run with another --n, or one not finished: its rates would mislead.
        sys.exit(f"error: {len(incomplete)} problems have fewer than {k} samples in {eval_run}")
    return [
        {**row, "pass_rate": rates[row["id"]]["pass_rate"]}
        for row in read_records(candidates)
        if rates[row["id"]]["kept"]
    ]


def main(argv: list[str]) -> None:
    candidates, eval_run, k, low, high, out = argv
    kept = band(Path(candidates), Path(eval_run), int(k), float(low), float(high))
    Path(out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    total = len(read_records(Path(candidates)))
    families = ", ".join(f"{f} {n}" for f, n in sorted(Counter(r["family"] for r in kept).items()))
    print(f"{out}: {len(kept)} of {total} problems with pass rate in [{low}, {high}] ({families})")


if __name__ == "__main__":
    main(sys.argv[1:])
