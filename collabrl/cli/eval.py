"""`collab eval BENCH …` and `collab eval report RUN …`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Column, Table
from typer.core import TyperGroup

from collabrl.cli import options as opt
from collabrl.cli.cautions import print_warnings
from collabrl.cli.console import make_console
from collabrl.cli.progress import progress_bar
from collabrl.redact import redact_text

if TYPE_CHECKING:
    from collabrl.eval.config import EvalConfig

console = make_console()


class _DefaultToRun(TyperGroup):
    """`collab eval aime24 …` and `collab eval -c x.yaml aime24` mean `collab eval run …`:
    anything but a subcommand or `--help` goes to `run`."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_DefaultToRun,
    help="Evaluate a model on a benchmark, or compare finished runs. "
    "`collab eval BENCH [OPTIONS]` is short for `collab eval run BENCH [OPTIONS]`: "
    "anything that is not a subcommand goes to `run`.",
    no_args_is_help=True,
)

HEADLINE_PREFIXES = ("pass@", "avg@", "maj@", "strict-match", "flexible-extract", "f1@")
COLLAB_KEYS = (
    "call_ratio_requested",
    "calls_per_sample",
    "call_failures",
    "format_errors",
    "strategies_per_sample",
    "strategies_injected_per_sample",
)
# AlphaApollo's tool metrics: shown together when any tool was called.
TOOL_KEYS = (
    "tool_calls_per_sample",
    "tool_call_error_rate",
    "tool_use_rate",
    "accuracy_with_tools",
    "accuracy_without_tools",
)

# Left out of the table with a row per benchmark, so that it fits a terminal; each run's
# metrics.json and `collab eval report` have them.
SUITE_HIDDEN = frozenset(
    {"var", "var_f1", "mean_completion_tokens", "tokens_per_second", "generation_seconds"}
)


@app.command("run", cls=opt.config_command("eval"))
def run(
    ctx: typer.Context,
    benchmark: str = opt.config_argument("benchmark", required=True),
    model: str = opt.MODEL,
    n: int = opt.config_option("sampling.n", "--n"),
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    top_p: float = opt.TOP_P,
    seed: int = opt.SEED,
    limit: int = opt.config_option("limit", "--limit"),
    num_fewshot: int = opt.config_option("num_fewshot", "--num-fewshot"),
    fewshot_as_multiturn: bool = opt.config_option(
        "fewshot_as_multiturn", "--fewshot-as-multiturn/--fewshot-in-one-turn"
    ),
    protocol: str = opt.PROTOCOL,
    tokenizer: str = opt.TOKENIZER,
    prompt: str = opt.PROMPT,
    engine: str = opt.ENGINE,
    batch_size: int = opt.BATCH_SIZE,
    device: str = opt.DEVICE,
    api_key: str = opt.API_KEY,
    out: str = opt.OUT,
    judge: str = opt.config_option("judge", "--judge"),
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """Sample a model on a benchmark, or on several (aime24,math500) in turn; write
    config.yaml, samples.jsonl, metrics.json and results.json into each one's run folder."""
    from collabrl.eval.runner import run_eval
    from collabrl.eval.suite import benchmark_names

    # The options above, and the protocols' options built from the registry, reach the
    # config through ctx (see cli/options.py), by their keys.
    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)  # every value, before the benchmark or a model is loaded
    print_warnings(console, cfg.warnings())  # before anything loads, suites included
    names = benchmark_names(cfg.benchmark)
    if len(names) > 1:
        _run_suite(cfg, names)
        return
    with progress_bar(console, f"{cfg.benchmark} · {cfg.model}") as progress:
        result = run_eval(cfg, progress=progress)
    _print_summary(result.metrics, result.out_dir, result.new_samples)
    _warn_truncated({cfg.benchmark: result.metrics})


def _run_suite(cfg: EvalConfig, names: list[str]) -> None:
    """Every benchmark in turn, then one table with a row per benchmark."""
    from collabrl.eval.suite import run_suite

    results = run_suite(cfg, names, lambda c: progress_bar(console, f"{c.benchmark} · {c.model}"))
    rows = {name: _suite_row(result.metrics) for name, result in results.items()}
    labels = list(dict.fromkeys(label for row in rows.values() for label in row))
    title = f"{redact_text(cfg.model)} · {cfg.protocol.name} · {cfg.sampling.n} samples per problem"
    table = Table("benchmark", *labels, title=title)
    for name, row in rows.items():
        table.add_row(name, *(row.get(label, "-") for label in labels))
    console.print(table)
    for name, result in results.items():
        if "stand_in" in result.metrics:
            console.print(f"[yellow]{name}: {result.metrics['stand_in']}[/]")
        console.print(f"{name}: {result.new_samples} new samples · run folder: {result.out_dir}")
    _warn_truncated({name: result.metrics for name, result in results.items()})


def _warn_truncated(metrics: dict[str, dict]) -> None:
    """A line for each benchmark that lost many samples to --max-tokens (report.py)."""
    from collabrl.eval.report import truncation_warning

    print_warnings(console, (truncation_warning(name, m) for name, m in metrics.items()))


def _suite_row(metrics: dict) -> dict[str, str]:
    """A benchmark's cells in the suite's table: its problems, then its summary's scores."""
    cells = {"problems": str(int(metrics["problems"]))}
    return cells | {k: v for k, v in _summary(metrics) if k not in SUITE_HIDDEN}


def _print_summary(metrics: dict, out_dir: Path, new_samples: int) -> None:
    n = int(metrics["samples_per_problem"])
    table = Table("metric", "value", title=f"{int(metrics['problems'])} problems × {n} samples")
    for label, value in _summary(metrics):
        table.add_row(label, value)
    console.print(table)
    if "stand_in" in metrics:
        console.print(f"[yellow]{metrics['stand_in']}[/]")
    console.print(f"{new_samples} new samples · run folder: {out_dir}")


def _summary(metrics: dict) -> list[tuple[str, str]]:
    """The metrics a finished run prints, as (label, formatted value)."""
    from collabrl.eval.metrics import log2_ks
    from collabrl.eval.report import format_value

    n = int(metrics["samples_per_problem"])
    shown = [f"pass@{k}" for k in log2_ks(n)]  # pass@k for k in 1, 2, 4, … and n
    keys = [k for k in metrics if k.startswith(HEADLINE_PREFIXES)]
    keys = [k for k in keys if not k.startswith("pass@") or k in shown]
    keys += [
        "var",
        "var_f1",
        "stderr",
        "call_ratio",
        *(k for k in COLLAB_KEYS if metrics.get(k)),  # shown when a protocol used them
        *(TOOL_KEYS if metrics.get("tool_calls_per_sample") else ()),
        "truncated",
        "mean_completion_tokens",
        "tokens_per_second",
        "generation_seconds",
    ]
    rows = [(key, format_value(metrics[key])) for key in keys]
    rows += [(f"judge/{key}", format_value(v)) for key, v in metrics.get("judge", {}).items()]
    return rows


@app.command("report")
def report(
    runs: list[Path] = typer.Argument(
        ..., help="Run folders to compare; a suite's --out folder stands for its benchmarks'."
    ),
    format: str = typer.Option("table", "--format", help="table, markdown or json."),
    student: Path = typer.Option(
        None, "--student", help="Run of the small model alone: adds RelayLLM's router baselines."
    ),
    teacher: Path = typer.Option(None, "--teacher", help="Run of the large model alone."),
    plot: Path = typer.Option(
        None,
        "--plot",
        help="Also draw every run's pass@k against k (log2 axis) into this image "
        "(.png, .pdf or .svg), from the runs' samples.",
    ),
    by: str = typer.Option(
        None,
        "--by",
        help="Also a table per group of problems: the first capture of this regular "
        "expression in each problem's id (arith's families: 'arith-\\w+-(\\w+)-'), with "
        "the share right, right without a call, calling, calls, call ratio and "
        "collaborator tokens.",
    ),
) -> None:
    """Compare finished runs side by side, one row per run labelled by model, protocol
    and benchmark (and against random/perfect routers; --plot draws pass@k curves)."""
    from collabrl.errors import UserError
    from collabrl.eval.report import (
        comparison_warnings,
        group_rows,
        load_run,
        plot_pass_at_k,
        report_rows,
        router_rows,
        run_folders,
    )

    if format not in ("table", "markdown", "json"):
        raise UserError(f"unknown --format '{format}'", "use table, markdown or json")
    if (student is None) != (teacher is None):
        raise UserError("router baselines need both runs", "pass --student RUN and --teacher RUN")
    loaded = [load_run(r) for r in run_folders(runs)]  # a suite's --out DIR: its runs
    warnings = comparison_warnings(loaded)
    # On stderr: stdout stays a table, markdown or JSON that can be piped.
    print_warnings(make_console(stderr=True), warnings)
    tables = [report_rows(loaded)]
    if student is not None:
        tables.append(router_rows(student, teacher, loaded))
    if by is not None:
        tables.append(group_rows(loaded, by))
    if plot is not None:
        plot_pass_at_k(loaded, plot)
        # On stderr: stdout stays a table, markdown or JSON that can be piped.
        make_console(stderr=True).print(f"pass@k plot: {plot}", highlight=False)
    if format == "json":
        print(json.dumps({"runs": loaded, "tables": tables, "warnings": warnings}, indent=2))
        return
    if format == "table":
        _print_runs(loaded)
        tables = tables[1:]
    for header, rows in tables:
        _print_table(header, rows, format)


def _print_runs(loaded: list[dict]) -> None:
    """The runs' metrics, a row per metric and a column per run, in as many tables as
    the console's width needs; each run's model above them, whole (a path fits no cell)."""
    from collabrl.eval.report import column_groups, metric_rows, run_names

    models = {name: run["model"] for name, run in zip(run_names(loaded), loaded, strict=True)}
    lines = (
        [f"model: {m}" for m in set(models.values())]
        if len(set(models.values())) == 1
        else [f"model of {name}: {m}" for name, m in models.items()]
    )
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    header, rows = metric_rows(loaded)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    for group in column_groups(widths[1:], widths[0], console.width):
        columns = [0, *(index + 1 for index in group)]
        _print_table([header[i] for i in columns], [[r[i] for i in columns] for r in rows], "table")


def _print_table(header: list[str], rows: list[list[str]], format: str) -> None:
    from collabrl.eval.report import to_markdown

    if format == "markdown":
        print(to_markdown(header, rows) + "\n")
        return
    # A cell too wide for its column wraps rather than losing its end to `…`.
    table = Table(*(Column(name, overflow="fold") for name in header))
    for row in rows:
        table.add_row(*row)
    console.print(table)
