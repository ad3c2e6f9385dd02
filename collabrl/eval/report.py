"""Compare finished eval runs: one row per run, the metrics side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.config import read_yaml
from collabrl.errors import UserError

# Columns shown by default, in order; `{n}` is each run's samples per problem.
HEADLINE = ("pass@1", "avg@{n}", "maj@{n}", "f1@{n}", "var", "stderr", "call_ratio")


def load_run(run_dir: Path) -> dict[str, Any]:
    """A run's identity (benchmark, model, n, temperature) and its metrics."""
    metrics_path = run_dir / runs.METRICS
    if not metrics_path.is_file():
        raise UserError(f"{run_dir} has no {runs.METRICS}", "is it a finished `collab eval` run?")
    try:
        metrics = json.loads(metrics_path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(
            f"{metrics_path} is not valid JSON", "re-run the eval to rewrite it"
        ) from err
    config = read_yaml(run_dir / runs.CONFIG) if (run_dir / runs.CONFIG).exists() else {}
    sampling = config.get("sampling", {})
    return {
        "run": str(run_dir),
        "benchmark": config.get("benchmark", "?"),
        "model": config.get("model", "?"),
        "n": int(metrics.get("samples_per_problem", sampling.get("n", 1))),
        "temperature": sampling.get("temperature"),
        "metrics": metrics,
    }


def report_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Table header and rows with the headline metrics of every run."""
    header = ["run", "benchmark", "model", "n", "problems", *_metric_labels(runs)]
    rows = []
    for run in runs:
        m = run["metrics"]
        cells = [Path(run["run"]).name, run["benchmark"], run["model"], str(run["n"])]
        cells.append(str(int(m.get("problems", 0))))
        for label in header[5:]:
            key = label.replace("@n", f"@{run['n']}")
            cells.append(format_value(m.get(key)))
        rows.append(cells)
    return header, rows


def _metric_labels(runs: list[dict[str, Any]]) -> list[str]:
    labels = [name.replace("{n}", "n") for name in HEADLINE]
    present = [
        label
        for label in labels
        if any(label.replace("@n", f"@{r['n']}") in r["metrics"] for r in runs)
    ]
    return present


def format_value(value: Any) -> str:
    """A metric as printed: 4 decimals, '-' for a metric with no value (None)."""
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def to_markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def router_rows(
    student: Path, teacher: Path, runs: list[dict[str, Any]]
) -> tuple[list[str], list[list[str]]]:
    """RelayLLM's router baselines from two solo runs, against the collaborative runs."""
    from collabrl.eval.routers import paired_outcomes, router_table

    pairs = paired_outcomes(student, teacher)
    collab = [
        (Path(r["run"]).name, r["metrics"][f"avg@{r['n']}"], r["metrics"]["call_ratio"])
        for r in runs
        if r["metrics"].get("call_ratio") and f"avg@{r['n']}" in r["metrics"]
    ]
    points = router_table(pairs, collab)
    rows = [[p.name, *map(format_value, (p.accuracy, p.call_ratio, p.routed))] for p in points]
    return ["router", "accuracy", "call_ratio", "routed"], rows
