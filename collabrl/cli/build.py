"""`collab build-warmup relay|rsim|consult|apollo`: warm-up SFT sets sampled from the policy."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from collabrl.cli import options as opt
from collabrl.cli.cautions import print_warnings
from collabrl.cli.console import make_console
from collabrl.cli.progress import progress_bar

console = make_console()

app = typer.Typer(
    help="Build a warm-up SFT set from the policy's own samples (rows TRL's SFTTrainer "
    "takes as they are). An existing --out folder is resumed.",
    no_args_is_help=True,
)

DATA = opt.config_option("data", "--data")
LIMIT = opt.config_option("limit", "--limit")
OUT = opt.config_option("out", "--out")


@app.command("relay", cls=opt.config_command("build-warmup-relay"))
def relay(
    ctx: typer.Context,
    model: str = opt.MODEL,
    data: str = DATA,
    limit: int = LIMIT,
    responses: int = opt.config_option("responses_per_problem", "--responses-per-problem"),
    insertions: int = opt.config_option("insertions", "--insertions"),
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    seed: int = opt.SEED,
    tokenizer: str = opt.config_option("tokenizer", "--tokenizer"),
    engine: str = opt.ENGINE,
    batch_size: int = opt.BATCH_SIZE,
    device: str = opt.DEVICE,
    out: str = OUT,
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """RelayLLM §3.1: insert `<call>n</call>` at random token indices of the policy's own
    responses (n = d·10^k, clipped to the tokens left)."""
    from collabrl.builders.relay_warmup import build_relay_warmup

    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)
    _warn_test_split(cfg.data)
    with progress_bar(console, f"relay warm-up · {cfg.model} on {cfg.data}") as progress:
        result = build_relay_warmup(cfg, progress)
    s = result.stats
    _print(
        result.out_dir,
        result.new_samples,
        [
            ("rows", s["rows"]),
            ("responses rejected", sum(s["rejected"].values())),
            ("commands", s["insertions"]),
            ("n clipped", s["clipped"]),
            ("median n", s["n"]["median"]),
            ("median position", round(s["relative_position"]["median"], 3)),
            ("points redrawn", sum(s["redrawn_points"].values())),
        ],
        s["rejected"],
    )


@app.command("rsim", cls=opt.config_command("build-warmup-rsim"))
def rsim(
    ctx: typer.Context,
    model: str = opt.MODEL,
    data: str = DATA,
    rows: int = opt.config_option("rows", "--rows"),
    limit: int = LIMIT,
    samples: int = opt.config_option("samples_per_problem", "--samples-per-problem"),
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    seed: int = opt.SEED,
    tokenizer: str = opt.config_option("tokenizer", "--tokenizer"),
    engine: str = opt.ENGINE,
    batch_size: int = opt.BATCH_SIZE,
    device: str = opt.DEVICE,
    out: str = OUT,
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """rSIM appendix A.1: keep the reasoner's samples that follow the `\\n\\n` step format
    and are incorrect, until --rows of them."""
    from collabrl.builders.rsim_warmup import build_rsim_warmup

    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)
    _warn_test_split(cfg.data)
    with progress_bar(console, f"rSIM warm-up · {cfg.model} on {cfg.data}") as progress:
        result = build_rsim_warmup(cfg, progress)
    s = result.stats
    _print(
        result.out_dir,
        result.new_samples,
        [
            ("rows", f"{s['rows']} of {s['rows_wanted']}"),
            ("samples drawn", s["sampled"]),
            *((f"rejected: {why}", count) for why, count in s["rejected"].items()),
            ("median steps", s["steps"]["median"]),
        ],
        s["rejected"],
    )
    if not s["complete"]:
        console.print(
            f"[yellow]the data ran out before {s['rows_wanted']} rows[/]: "
            "raise --limit or --samples-per-problem, then re-run into the same --out"
        )


@app.command("consult", cls=opt.config_command("build-warmup-consult"))
def consult(
    ctx: typer.Context,
    model: str = opt.MODEL,
    data: str = DATA,
    limit: int = LIMIT,
    call_fraction: float = opt.config_option("call_fraction", "--call-fraction"),
    num_experts: int = opt.config_option("num_experts", "--num-experts"),
    expert: str = opt.config_option("expert", "--expert"),
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    seed: int = opt.SEED,
    tokenizer: str = opt.config_option("tokenizer", "--tokenizer"),
    engine: str = opt.ENGINE,
    batch_size: int = opt.BATCH_SIZE,
    device: str = opt.DEVICE,
    out: str = OUT,
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """This project's addition to EAPO: rows of the consult training prompt. A share
    --call-fraction of the problems call: an `<agent_calls>` block asking an expert the
    problem, then, after the expert's `<agent_returns>`, its "Answer: xxx" line. The rest
    are the policy's own answers ending in "Answer: xxx"."""
    from collabrl.builders.consult_warmup import build_consult_warmup

    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)
    _warn_test_split(cfg.data)
    with progress_bar(console, f"consult warm-up · {cfg.model} on {cfg.data}") as progress:
        result = build_consult_warmup(cfg, progress)
    s = result.stats
    _print(
        result.out_dir,
        result.new_samples,
        [
            ("rows", s["rows"]),
            ("call rows", s["call_rows"]),
            ("read rows (answer after the returns)", s["read_rows"]),
            ("answer rows", s["answer_rows"]),
            *((f"rejected: {why}", count) for why, count in s["rejected"].items()),
            ("answers correct", s["answers_correct"]),
            ("expert answers correct", s["expert_answers_correct"]),
        ],
        s["rejected"],
    )


@app.command("apollo", cls=opt.config_command("build-warmup-apollo"))
def apollo(
    ctx: typer.Context,
    model: str = opt.MODEL,
    data: str = DATA,
    limit: int = LIMIT,
    samples: int = opt.config_option("samples_per_problem", "--samples-per-problem"),
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    seed: int = opt.SEED,
    tokenizer: str = opt.config_option("tokenizer", "--tokenizer"),
    engine: str = opt.ENGINE,
    batch_size: int = opt.BATCH_SIZE,
    device: str = opt.DEVICE,
    out: str = OUT,
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """This project's addition to AlphaApollo: the policy's own tool traces, sampled with
    a forced call and a worked example, kept when the last call printed the answer; rows
    of the A.1 prompt without those aids, ending "The answer is \\boxed{X}"."""
    from collabrl.builders.apollo_warmup import build_apollo_warmup

    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)
    _warn_test_split(cfg.data)
    with progress_bar(console, f"apollo warm-up · {cfg.model} on {cfg.data}") as progress:
        result = build_apollo_warmup(cfg, progress)
    s = result.stats
    _print(
        result.out_dir,
        result.new_samples,
        [
            ("traces", s["traces"]),
            ("rows", s["rows"]),
            ("call rows", s["call_rows"]),
            ("answer rows", s["answer_rows"]),
            *((f"rejected: {why}", count) for why, count in s["rejected"].items()),
            ("traces with a failed call", s["traces_with_a_failed_call"]),
        ],
        s["rejected"],
    )


def _warn_test_split(data: str) -> None:
    from collabrl.eval.cautions import split_warning

    print_warnings(console, [split_warning(data, "building a warm-up set from")])


def _print(
    out_dir: Path, new_samples: int, rows: list[tuple[str, object]], rejected: dict[str, int]
) -> None:
    table = Table("", "value")
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    from collabrl.builders.policy import OVERSIZED  # loaded by the build already

    if rejected.get(OVERSIZED):
        console.print(f"note: {rejected[OVERSIZED]} units skipped (rejected.jsonl): {OVERSIZED}")
    console.print(
        f"{new_samples} new samples · folder: {out_dir} (rows.jsonl, dataset/, stats.png)"
    )
