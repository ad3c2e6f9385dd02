"""Evidence data for rSIM: the candidate problems the reasoner solves sometimes.

`collab filter` asks a model one prompt; rSIM's reasoner answers under the strategy
protocol (a planner's guidance before every step, the step and episode budgets), and
its pass rate there is what gives R_acc a group variance. So the pass rates come from
`collab eval run CANDIDATES --protocol strategy --n K` at the rollout settings, and
this script keeps the candidates whose pass rate over those K samples is within
[LOW, HIGH], by `collab filter`'s own rule (`builders.filter`: every one of the K
samples scored, both bounds kept). The rates are read from the eval run's samples, or
from an evidence record of that run (RECORD.json:EVAL, the evaluation EVAL of a record
written by record.py: each problem's mean correctness over its K samples), so that a
fresh checkout rebuilds the band without sampling it again. The kept rows are the
candidates' own rows (family and all) with their pass rate, written to OUT; a summary
goes to stdout.

    python scripts/evidence/rsim_band.py CANDIDATES.jsonl EVAL_RUN 8 0.2 0.6 OUT.jsonl
    python scripts/evidence/rsim_band.py CANDIDATES.jsonl RECORD.json:train 8 0.2 0.6 OUT.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from collabrl.builders.filter import FilterConfig, in_band, pass_rates
from collabrl.data.benchmarks import load_benchmark
from collabrl.errors import UserError
from collabrl.runs import SAMPLES, read_records
from collabrl.train.evidence import read_record


def run_rates(candidates: Path, eval_run: Path, config: FilterConfig) -> dict[str, float]:
    """Each candidate's pass rate over the first k samples of `eval_run`."""
    items = load_benchmark(str(candidates)).items
    rates = pass_rates(items, read_records(eval_run / SAMPLES), config)
    incomplete = [r["item_id"] for r in rates if r["k"] < config.k]
    if incomplete:
        # An eval run with another --n, or one not finished: its rates would mislead.
        sys.exit(
            f"error: {len(incomplete)} problems have fewer than {config.k} samples in {eval_run}"
        )
    return {r["item_id"]: r["pass_rate"] for r in rates}


def record_rates(path: Path, name: str, k: int) -> dict[str, float]:
    """The pass rates a record keeps for its evaluation `name`, refused unless that
    evaluation sampled k a problem."""
    evals = read_record(path)["evals"]
    if name not in evals:
        sys.exit(f"error: {path} has no evaluation {name!r} (it has {', '.join(sorted(evals))})")
    if evals[name]["n"] != k:
        sys.exit(f"error: {path}:{name} sampled {evals[name]['n']} a problem, not {k}")
    return evals[name]["correct"]


def band(candidates: Path, source: str | Path, k: int, low: float, high: float) -> list[dict]:
    """The candidate rows whose pass rate in `source` (an eval run folder, or
    RECORD.json:EVAL) is within [low, high]."""
    config = FilterConfig(teacher=str(source), k=k, threshold=low, max_threshold=high)
    config.check()  # the same bounds `collab filter` accepts
    path, _, name = str(source).rpartition(":")
    if path.endswith(".json"):
        rates = record_rates(Path(path), name, k)
    else:
        rates = run_rates(candidates, Path(source), config)
    rows = read_records(candidates)
    missing = [r["id"] for r in rows if r["id"] not in rates]
    if missing:  # a record of other candidates: the band would silently shrink
        sys.exit(f"error: {len(missing)} candidates have no pass rate in {source}")
    return [{**r, "pass_rate": rates[r["id"]]} for r in rows if in_band(rates[r["id"]], config)]


def main(argv: list[str]) -> None:
    candidates, source, k, low, high, out = argv
    kept = band(Path(candidates), source, int(k), float(low), float(high))
    Path(out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    total = len(read_records(Path(candidates)))
    families = ", ".join(f"{f} {n}" for f, n in sorted(Counter(r["family"] for r in kept).items()))
    print(f"{out}: {len(kept)} of {total} problems with pass rate in [{low}, {high}] ({families})")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UserError as err:  # a bad record or band: one line, no traceback
        sys.exit(f"error: {err}")
