"""`collab filter`: keep the training problems a teacher solves, and/or decontaminate them."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from collabrl.cli import options as opt
from collabrl.cli.cautions import print_warnings
from collabrl.cli.console import make_console
from collabrl.cli.progress import progress_bar

console = make_console()


def filter_data(
    ctx: typer.Context,
    teacher: str = opt.config_option("teacher", "--teacher"),
    data: str = opt.config_option("data", "--data"),
    k: int = opt.config_option("k", "--k"),
    threshold: float = opt.config_option("threshold", "--threshold"),
    max_threshold: float = opt.config_option("max_threshold", "--max-threshold"),
    limit: int = opt.config_option("limit", "--limit"),
    out: str = opt.config_option("out", "--out"),
    decontaminate: bool = opt.config_option("decontaminate", "--decontaminate"),
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    seed: int = opt.SEED,
    engine: str = opt.ENGINE,
    batch_size: int = opt.BATCH_SIZE,
    device: str = opt.DEVICE,
    api_key: str = opt.API_KEY,
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """Sample a teacher k times per problem and keep the problems it solves often enough
    (RelayLLM §3.2.2), or, with --max-threshold, within a band of pass rates;
    --decontaminate first drops rows that overlap an evaluation set."""
    from collabrl.builders.filter import build_filter
    from collabrl.eval.cautions import split_warning

    # The options above reach the config through ctx (see cli/options.py), by their keys.
    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)  # every value, before the data or a model is loaded
    print_warnings(console, [split_warning(cfg.data, "filtering")])
    with progress_bar(console, f"filter · {cfg.teacher or 'decontaminate'}") as progress:
        result = build_filter(cfg, progress=progress)
    _print_summary(result.stats, result.out_dir, result.new_samples)


def _print_summary(stats: dict, out_dir: Path, new_samples: int) -> None:
    table = Table("", "value", title=f"collab filter · {stats['data']}")
    table.add_row("problems", str(stats["problems"]))
    if "decontamination" in stats:
        table.add_row("contaminated (dropped)", str(stats["decontamination"]["dropped"]))
    if stats["teacher"] is not None:
        table.add_row("teacher", stats["teacher"])
        table.add_row("mean pass rate", f"{stats['pass_rate']['mean']:.3f}")
        table.add_row(f"below threshold {stats['threshold']:g}", str(stats["below_threshold"]))
        if stats["max_threshold"] is not None:
            above = f"above max threshold {stats['max_threshold']:g}"
            table.add_row(above, str(stats["above_max_threshold"]))
    table.add_row("kept", str(stats["kept"]))
    console.print(table)
    if "stand_in" in stats:
        console.print(f"[yellow]{stats['stand_in']}[/]")
    if stats["oversized"]:
        from collabrl.data.benchmarks import MAX_PROBLEM_CHARS

        skipped = stats["oversized"]
        console.print(f"note: {skipped} problems skipped, each over {MAX_PROBLEM_CHARS} characters")
    failed = stats.get("failed_samples", 0)
    if failed:
        console.print(f"[red]{failed} samples failed; re-run the same command to retry them[/]")
    console.print(f"{new_samples} new samples · output folder: {out_dir}")
