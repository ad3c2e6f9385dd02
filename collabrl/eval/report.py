"""Compare finished eval runs: one row per run, the metrics side by side (in a terminal,
one row per metric and a column per run, as many runs to a table as its width holds),
their pass@k curves, and a warning where runs set side by side are not alike (prompt,
chat template, data, model revision) or lost many samples to the token budget."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.config import read_yaml
from collabrl.errors import UserError
from collabrl.eval.metrics import log2_ks, pass_at_k
from collabrl.eval.results import RESULTS, read_results
from collabrl.eval.routers import paired_outcomes, router_table
from collabrl.eval.samples import NOT_A_RUN, read_samples, short
from collabrl.userfiles import read_json

# Columns shown by default, in order; `{n}` is each run's samples per problem and
# `pass@{k}` stands for every pass@k a run computed. strict-match and flexible-extract
# are lm-eval's two gradings (metrics.py); older runs have neither. f1@{n} and var_f1 are
# EAPO's "Pass@32" and "Var" at n = 32 (var is over correctness). truncated is the share
# of samples the token budget cut.
HEADLINE = (
    *("pass@{k}", "strict-match", "flexible-extract", "avg@{n}", "maj@{n}", "f1@{n}"),
    *("var", "var_f1", "stderr", "call_ratio", "truncated"),
)
PASS_AT_K = re.compile(r"pass@(\d+)")
# The columns before the metrics: what tells one run from another.
IDENTITY = ("run", "model", "protocol", "benchmark", "n", "problems")
# Past this share of truncated samples a run's score says more about --max-tokens than
# about the model: the run and the report say so.
TRUNCATION_WARNING = 0.10
# What two runs of one benchmark must share to be compared, as load_run reads it.
ALIKE = {
    "prompt": "prompt (template or examples)",
    "chat_template": "chat template",
    "data": "data",
    "revision": "model revision",
}
# The image formats `--plot` writes, by the path's suffix.
PLOT_FORMATS = (".png", ".pdf", ".svg")


def run_folders(paths: list[Path]) -> list[Path]:
    """The run folders of `paths`: a suite's `--out DIR` (its results.json holds several
    benchmarks, each in a folder under DIR) stands for its benchmarks' folders, in order."""
    found = []
    for path in paths:
        results = path / RESULTS
        samples = read_results(results)["samples"] if results.is_file() else {}
        folders = [path / Path(name).parent for name in samples.values()]
        found += [path] if folders in ([], [path]) else folders
    return found


def load_run(run_dir: Path) -> dict[str, Any]:
    """A run's identity (model, protocol, benchmark, n, temperature) and its metrics.

    Both come from the run's results.json; a folder written before it (metrics.json only)
    gives its metrics.json and the identity in its config.yaml ('?' where it has none). A
    folder without either written by `collab eval`, or holding values of the wrong type,
    is refused.
    """
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a folder", NOT_A_RUN)
    path = metrics_path = run_dir / RESULTS
    recorded: dict[str, str | None] = dict.fromkeys(ALIKE)
    if path.is_file():
        doc = read_results(path)
        if len(doc["results"]) != 1:
            raise UserError(f"{path} holds {len(doc['results'])} benchmarks", NOT_A_RUN)
        metrics, config = ours(next(iter(doc["results"].values()))), doc["config"]
        recorded = recorded_setup(doc)
    else:
        metrics_path, path = run_dir / runs.METRICS, run_dir / runs.CONFIG
        metrics = _read_metrics(metrics_path)
        config = read_yaml(path) if path.exists() else {}
    _check_metrics(metrics, metrics_path)
    protocol = _typed(config, "protocol", dict, {}, path)
    sampling = _typed(config, "sampling", dict, {}, path)
    return {
        "run": str(run_dir),
        "model": _typed(config, "model", str, "?", path),
        "protocol": _typed(protocol, "name", str, "?", path, "protocol.name"),
        "benchmark": _typed(config, "benchmark", str, "?", path),
        "n": int(metrics["samples_per_problem"]),
        "temperature": _typed(sampling, "temperature", (int, float), None, path),
        "metrics": metrics,
        "setup": recorded,
    }


def ours(results: Any) -> Any:
    """A benchmark's results without the copies of its means under lm-eval's names
    (`exact_match,none`, its `alias`): the metrics as metrics.json names them."""
    if not isinstance(results, dict):
        return results  # refused by _check_metrics
    return {k: v for k, v in results.items() if "," not in k and k != "alias"}


def recorded_setup(doc: dict[str, Any]) -> dict[str, str | None]:
    """What a results.json records of its run's prompt, chat template, data and model
    revision (ALIKE's keys), each as a short hash or name; None where it records none
    (a file from before it was recorded, an endpoint's template)."""
    task = next(iter(doc["configs"].values()), {})
    task = task if isinstance(task, dict) else {}
    values = {
        "prompt": task.get("prompt_hash"),
        "chat_template": doc.get("chat_template_sha"),
        "data": task.get("data_hash"),
        "revision": doc.get("model_sha"),
    }
    return {k: v[:12] if isinstance(v, str) else None for k, v in values.items()}


def _typed(
    mapping: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    default: Any,
    path: Path,
    name: str | None = None,
) -> Any:
    """`mapping[key]` if it is a `kind`, `default` when it is missing (or null); a value of
    another type is refused, since `collab eval` never writes one."""
    value = mapping.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind):
        raise UserError(f"{path}: {name or key} is {short(value)}, of the wrong type", NOT_A_RUN)
    return value


def _read_metrics(path: Path) -> dict[str, Any]:
    """A run's metrics.json, as a folder from before results.json holds them."""
    if not path.is_file():
        raise UserError(
            f"{path.parent} has no {runs.METRICS} nor {RESULTS}",
            "is it a finished `collab eval` run?",
        )
    return read_json(path, "metrics", "re-run the eval to rewrite it")


def _check_metrics(metrics: Any, path: Path) -> None:
    """Refuse metrics unless they are the ones `collab eval` writes: a whole number of
    samples per problem, and a finite number for every metric the report reads."""
    if not isinstance(metrics, dict) or "samples_per_problem" not in metrics:
        raise UserError(
            f"{path} was not written by `collab eval` (it has no samples_per_problem)", NOT_A_RUN
        )
    n = metrics["samples_per_problem"]
    if not _is_number(n) or n < 1 or n != int(n):
        raise UserError(f"{path}: samples_per_problem is {short(n)}, not a count", NOT_A_RUN)
    for key, value in metrics.items():
        if _is_metric(key) and not _is_number(value):
            raise UserError(f"{path}: {key} is {short(value)}, not a number", NOT_A_RUN)


def _is_number(value: Any) -> bool:
    """A finite int or float (a JSON `true` is no number)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_metric(key: str) -> bool:
    """A key the report reads as a number: the headline's, any pass@k, and problems."""
    heads = tuple(label.split("@")[0] + "@" if "@" in label else label for label in HEADLINE)
    return key == "problems" or key.startswith(heads)


def report_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Table header and rows: each run's model, protocol, benchmark and headline metrics,
    a mean with its standard error (`0.5000 ± 0.2887`) where the run has one."""
    header = [*IDENTITY, *_metric_labels(runs)]
    rows = []
    for run, name in zip(runs, run_names(runs), strict=True):
        m = run["metrics"]
        cells = [name, run["model"], run["protocol"], run["benchmark"]]
        cells += [str(run["n"]), str(int(m.get("problems", 0)))]
        for label in header[len(IDENTITY) :]:
            key = label.replace("@n", f"@{run['n']}")
            cells.append(format_mean(m.get(key), m.get(f"{key}_stderr")))
        rows.append(cells)
    return header, rows


def metric_rows(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """report_rows turned on its side, for a terminal: a column per run (its name), a row
    per identity field and metric. The model is left out: a path does not fit a column
    (the caller prints each run's model above the table)."""
    header, rows = report_rows(runs)
    columns = list(zip(*rows, strict=True))  # one per field of header, across the runs
    skipped = {"run", "model"}
    body = [[label, *cells] for label, cells in zip(header, columns, strict=True)]
    return ["run", *columns[0]], [row for row in body if row[0] not in skipped]


def column_groups(widths: list[int], first: int, room: int) -> list[list[int]]:
    """The runs' columns (of content `widths`) cut into tables that fit `room` columns,
    each table repeating the label column (`first` wide); a column wider than the room
    alone gets a table of its own. A rich table spends 3 columns per column (padding and
    border) and 1 on its left border."""
    groups: list[list[int]] = []
    used = room
    for index, width in enumerate(widths):
        if used + width + 3 > room:
            groups.append([])
            used = 1 + first + 3
        groups[-1].append(index)
        used += width + 3
    return groups


def comparison_warnings(loaded: list[dict[str, Any]]) -> list[str]:
    """One line per run that lost over TRUNCATION_WARNING of its samples to the token
    budget, and per way in which runs of one benchmark differ (ALIKE): their scores are
    then not the same measurement."""
    names = run_names(loaded)
    warnings = [
        found
        for run, name in zip(loaded, names, strict=True)
        if (found := truncation_warning(name, run["metrics"])) is not None
    ]
    by_benchmark: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for run, name in zip(loaded, names, strict=True):
        by_benchmark.setdefault(run["benchmark"], []).append((name, run))
    for benchmark, group in by_benchmark.items():
        for key, what in ALIKE.items():
            values = {name: run["setup"][key] for name, run in group if run["setup"][key]}
            if len(set(values.values())) > 1:
                shown = ", ".join(f"{name} {value}" for name, value in values.items())
                warnings.append(f"the {benchmark} runs differ in their {what}: {shown}")
    return warnings


def truncation_warning(name: str, metrics: dict[str, Any]) -> str | None:
    """A line when over TRUNCATION_WARNING of a run's samples hit the token budget: they
    are scored as they stand, most of them wrong, and the score says so only as a low one."""
    share = metrics.get("truncated")
    if not isinstance(share, int | float) or share <= TRUNCATION_WARNING:
        return None
    return (
        f"{name}: {share:.0%} of the samples were cut at the token budget (truncated); "
        "its scores count them as they stand: raise --max-tokens"
    )


# The per-group columns (`--by`): what a group's samples did, alone and with help.
GROUP_COLUMNS = (
    *("run", "group", "samples", "accuracy", "alone", "calling", "calls"),
    *("call_ratio", "helper_tokens"),
)


def group_rows(loaded: list[dict[str, Any]], by: str) -> tuple[list[str], list[list[str]]]:
    """One row per run and group of problems, the group being the first capture of the
    regular expression `by` in a problem's id (arith's family: `arith-\\w+-(\\w+)-`):
    the share of samples right, right without a call, and that called, the calls per
    sample, the mean share of tokens a collaborator wrote and its tokens per sample."""
    pattern = _group_pattern(by)
    rows = []
    for run, name in zip(loaded, run_names(loaded), strict=True):
        groups: dict[str, list[dict[str, Any]]] = {}
        for item, samples in samples_by_item(run).items():
            match = pattern.search(item)
            # An optional group (`(x)?`, `(x)|y`) may match without capturing: no group.
            group = match.group(1) if match else None
            groups.setdefault(group if group is not None else "(other)", []).extend(samples)
        rows += [[name, group, *_group_cells(samples)] for group, samples in groups.items()]
    return list(GROUP_COLUMNS), rows


def _group_pattern(by: str) -> re.Pattern[str]:
    try:
        pattern = re.compile(by)
    except re.error as err:
        raise UserError(f"--by '{by}' is not a regular expression ({err})", "fix it") from err
    if pattern.groups < 1:
        raise UserError(f"--by '{by}' captures nothing", "put the group's part in (…)")
    return pattern


def samples_by_item(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The loaded run's checked samples by problem: each problem's first n, in order."""
    return runs.group_by_item(read_samples(Path(run["run"])), run["n"])


def _group_cells(samples: list[dict[str, Any]]) -> list[str]:
    count = len(samples)
    alone = sum(bool(s["correct"]) and not s.get("calls", 0) for s in samples)
    calling = sum(s.get("calls", 0) > 0 for s in samples)
    ratios = [
        s.get("helper_tokens", 0) / s["completion_tokens"]
        for s in samples
        if s.get("completion_tokens")
    ]
    return [
        str(count),
        format_value(sum(bool(s["correct"]) for s in samples) / count),
        format_value(alone / count),
        format_value(calling / count),
        format_value(sum(s.get("calls", 0) for s in samples) / count),
        format_value(sum(ratios) / len(ratios) if ratios else 0.0),
        format_value(sum(s.get("helper_tokens", 0) for s in samples) / count),
    ]


def run_names(loaded: list[dict[str, Any]]) -> list[str]:
    """Each run by its folder's name, or by as many trailing parts of its path as tell it
    from the others (`a/aime24`, `b/aime24`: the folders of two suites)."""
    paths = [Path(run["run"]).absolute().parts for run in loaded]
    distinct = len(set(paths))
    for depth in range(1, max(map(len, paths))):
        names = ["/".join(parts[-depth:]) for parts in paths]
        if len(set(names)) == distinct:
            return names
    return [str(Path(*parts)) for parts in paths]


def _metric_labels(runs: list[dict[str, Any]]) -> list[str]:
    ks = sorted(
        {int(m[1]) for r in runs for key in r["metrics"] if (m := PASS_AT_K.fullmatch(key))}
    )
    labels: list[str] = []
    for name in HEADLINE:
        labels += [f"pass@{k}" for k in ks] if name == "pass@{k}" else [name.replace("{n}", "n")]
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


def format_mean(value: Any, stderr: Any) -> str:
    """A metric with its standard error, where it has one: `0.5000 ± 0.2887`."""
    if value is None or not isinstance(stderr, int | float) or isinstance(stderr, bool):
        return format_value(value)
    return f"{format_value(value)} ± {stderr:.4f}"


def format_p(p: float) -> str:
    """A p-value as printed: 4 decimals, or 2 significant digits below 0.0001."""
    return format_value(p) if p >= 1e-4 else f"{p:.1e}"


def to_markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def router_rows(
    student: Path, teacher: Path, runs: list[dict[str, Any]]
) -> tuple[list[str], list[list[str]]]:
    """RelayLLM's router baselines from two solo runs, against the collaborative runs."""
    pairs = paired_outcomes(student, teacher)
    collab = [
        (Path(r["run"]).name, r["metrics"][f"avg@{r['n']}"], r["metrics"]["call_ratio"])
        for r in runs
        if r["metrics"].get("call_ratio") and f"avg@{r['n']}" in r["metrics"]
    ]
    points = router_table(pairs, collab)
    rows = [[p.name, *map(format_value, (p.accuracy, p.call_ratio, p.routed))] for p in points]
    return ["router", "accuracy", "call_ratio", "routed"], rows


def pass_curve(run: dict[str, Any]) -> list[tuple[int, float]]:
    """(k, pass@k) for k = 1, 2, 4, … and n, from the run's samples.jsonl.

    The unbiased estimator over every problem whose n samples are all on disk (its first
    n by sample index), averaged over those problems, as `summarize` computes pass@k.
    """
    n = run["n"]
    by_item = samples_by_item(run)
    counts = [
        sum(bool(r["correct"]) for r in found) for found in by_item.values() if len(found) == n
    ]
    if not counts:
        raise UserError(
            f"{run['run']} has no problem with all its {n} samples in {runs.SAMPLES}",
            "--plot draws each run's samples; finish (resume) the run first",
        )
    return [(k, math.fsum(pass_at_k(n, c, k) for c in counts) / len(counts)) for k in log2_ks(n)]


def curve_labels(loaded: list[dict[str, Any]]) -> list[str]:
    """'model · protocol · benchmark' per run; the run is named too where two agree."""
    labels = [f"{_short_model(r['model'])} · {r['protocol']} · {r['benchmark']}" for r in loaded]
    return [
        f"{label} ({name})" if labels.count(label) > 1 else label
        for label, name in zip(labels, run_names(loaded), strict=True)
    ]


def _short_model(model: str) -> str:
    """A model folder by its name (a legend has no room for a path); URLs and names as is."""
    return model if "://" in model else Path(model.rstrip("/")).name or model


def plot_pass_at_k(loaded: list[dict[str, Any]], path: Path) -> None:
    """The runs' pass@k curves drawn into `path` (its suffix picks the format)."""
    check_plot_path(path)
    curves = [pass_curve(run) for run in loaded]  # every run's samples read before drawing
    _draw_curves(list(zip(curve_labels(loaded), curves, strict=True)), path)


def check_plot_path(path: Path) -> None:
    """Refuse a `--plot` path that would not be the file written: matplotlib adds `.png`
    to a name without a suffix (a folder's name included)."""
    if path.is_dir():
        raise UserError(f"--plot {path} is a folder", "name the image file, e.g. passk.png")
    if path.suffix.lower() not in PLOT_FORMATS:
        raise UserError(
            f"--plot {path} does not end in {', '.join(PLOT_FORMATS)}",
            "name the image file with the suffix of its format, e.g. passk.png",
        )


def _draw_curves(curves: list[tuple[str, list[tuple[int, float]]]], path: Path) -> None:
    """pass@k against k on a log2 axis, one labelled line per run (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    ks = sorted({k for _, points in curves for k, _ in points})
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, points in curves:
        ax.plot([k for k, _ in points], [v for _, v in points], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlim(ks[0] / 1.25, ks[-1] * 1.25)  # one k alone would give a zero-width axis
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("pass@k")
    ax.set_title("pass@k (unbiased estimator)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as err:  # a missing folder; a format matplotlib lacks
        raise UserError(
            f"cannot write the plot {path}: {str(err).splitlines()[0]}",
            "pass --plot a .png, .pdf or .svg path in an existing folder",
        ) from err
    finally:
        plt.close(fig)
