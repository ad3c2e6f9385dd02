"""`collab infer PROTOCOL QUESTION`: one problem through one protocol, as a transcript."""

from __future__ import annotations

from pathlib import Path

import typer

from collabrl.cli import options as opt
from collabrl.cli.console import make_console

console = make_console()


def infer(
    ctx: typer.Context,
    protocol: str = opt.config_argument(opt.PROTOCOL_KEY),
    question: str = opt.config_argument("question"),
    bench: str = opt.config_option("benchmark", "--bench"),
    item: str = opt.config_option("item", "--item"),
    model: str = opt.MODEL,
    tokenizer: str = opt.TOKENIZER,
    prompt: str = opt.PROMPT,
    max_tokens: int = opt.MAX_TOKENS,
    temperature: float = opt.TEMPERATURE,
    seed: int = opt.SEED,
    engine: str = opt.ENGINE,
    batch_size: int = opt.BATCH_SIZE,
    device: str = opt.DEVICE,
    api_key: str = opt.API_KEY,
    served_model: str = opt.config_option("engine.served_model", "--served-model"),
    as_json: bool = typer.Option(False, "--json", help="Print the episode as JSON."),
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """Run one problem through a protocol and print who wrote what."""
    from collabrl.cli.transcript import json_line, print_episode
    from collabrl.protocols.infer import infer_one

    # The options above, and the protocols' options built from the registry, reach the
    # config through ctx (see cli/options.py), by their keys.
    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)  # every value, before any model is loaded
    episode, seconds = infer_one(cfg)
    if as_json:
        print(json_line(episode.to_dict()))
        return
    print_episode(console, episode, seconds)
