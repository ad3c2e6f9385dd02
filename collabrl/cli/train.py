"""`collab train sft`: fine-tune a policy; the trainers live in `collabrl.train`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from collabrl.cli import options as opt
from collabrl.cli.progress import progress_bar

console = Console()

app = typer.Typer(
    help="Train a policy: sft now; grpo, relay and eapo join it.", no_args_is_help=True
)


@app.command("sft", cls=opt.config_command("train-sft"))
def sft(
    ctx: typer.Context,
    model: str = opt.MODEL,
    data: str = opt.config_option("data", "--data"),
    out: str = opt.config_option("out", "--out"),
    lora: bool = opt.config_option("lora", "--lora"),
    epochs: float = opt.config_option("epochs", "--epochs"),
    learning_rate: float = opt.config_option("learning_rate", "--learning-rate", "--lr"),
    seed: int = opt.config_option("seed", "--seed"),
    resume: bool = opt.config_option("resume", "--resume"),
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """RelayLLM §3.1 warm-up: supervised fine-tuning on prompt/completion rows (from
    `collab build-warmup`), the loss on the completion only. OUT/final is the model."""
    from collabrl.train.sft import train_sft

    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)
    with progress_bar(console, f"SFT · {cfg.model} on {cfg.data}") as progress:
        result = train_sft(cfg, progress)
    m = result.metrics
    loss = "n/a" if m["final_loss"] is None else f"{m['final_loss']:.4f}"
    resumed = f" (resumed at step {m['resumed_from']})" if m["resumed_from"] is not None else ""
    console.print(f"{m['steps']} steps{resumed} · final loss {loss}")
    console.print(
        f"model: {m['final']} (use it as --model) · folder: {result.out_dir} "
        "(metrics.jsonl, train_curve.png, checkpoints/)"
    )
