"""`collab evolve BENCH --model A --model B --rounds R`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from collabrl.cli import options as opt
from collabrl.cli.console import make_console

console = make_console()

COLUMNS = (
    ("round", "round"),
    ("candidates", "candidates"),
    ("candidate acc", "candidate_accuracy"),
    ("selected (score)", "selected_score_accuracy"),
    ("selected (vote)", "selected_vote_accuracy"),
    ("selected (verified)", "selected_verified_accuracy"),
    ("oracle", "oracle_accuracy"),
    ("mean score", "mean_score"),
)


def evolve(
    ctx: typer.Context,
    benchmark: str = opt.config_argument("benchmark", required=True),
    model: list[str] = opt.config_option("models", "--model", "-m"),
    rounds: int = opt.config_option("rounds", "--rounds"),
    branches: int = opt.config_option("sampling.n", "--branches"),
    verifier: list[str] = opt.config_option("verifiers", "--verifier"),
    select: str = opt.config_option("select", "--select"),
    limit: int = opt.config_option("limit", "--limit"),
    protocol: str = opt.PROTOCOL,
    tokenizer: str = opt.TOKENIZER,
    prompt: str = opt.PROMPT,
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    seed: int = opt.SEED,
    engine: str = opt.ENGINE,
    batch_size: int = opt.BATCH_SIZE,
    device: str = opt.DEVICE,
    api_key: str = opt.API_KEY,
    out: str = opt.config_option("out", "--out"),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --out from its first unfinished round."
    ),
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """K models × R rounds over a shared state of verified candidates; writes state.json,
    round-R.jsonl and curve.png."""
    from collabrl.evolve.runner import run_evolve
    from collabrl.evolve.state import check_resumable

    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)
    if resume:
        check_resumable(cfg.out)
    result = run_evolve(cfg, resume, on_round=_print_round)
    console.print(_table(result.rounds, cfg.select))
    console.print(f"{result.new_rounds} new rounds · run folder: {result.out_dir}")


def _print_round(summary: dict[str, Any]) -> None:
    console.print(
        f"round {summary['round']}: candidates {summary['candidate_accuracy']:.3f}, "
        f"selected {summary['selected_score_accuracy']:.3f} (score) / "
        f"{summary['selected_vote_accuracy']:.3f} (vote) / "
        f"{summary['selected_verified_accuracy']:.3f} (verified); "
        f"code re-runs: {summary['verified']:.3f} verified, {summary['refuted']:.3f} refuted"
    )


def _table(rounds: list[dict[str, Any]], select: str) -> Table:
    table = Table(*(title for title, _ in COLUMNS), title=f"evolve (final answer by {select})")
    for r in rounds:
        table.add_row(*(_cell(r[key]) for _, key in COLUMNS))
    return table


def _cell(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
