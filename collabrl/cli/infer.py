"""`collab infer PROTOCOL QUESTION`: one problem through one protocol, as a transcript."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from collabrl.cli import options as opt

console = Console()


def infer(
    protocol: str = typer.Argument(None, help="solo (default), relay, consult or strategy."),
    question: str = typer.Argument(None, help="The problem (or use --bench and --item)."),
    bench: str = typer.Option(None, "--bench", help="Take the problem from this benchmark."),
    item: str = typer.Option(None, "--item", help="Item id or 0-based position (default 0)."),
    model: str = typer.Option(None, "--model", "-m", help="Policy model reference or URL."),
    teacher: str = opt.TEACHER,
    expert: list[str] = opt.EXPERT,
    self_collab: bool = opt.SELF_COLLAB,
    planner: str = opt.PLANNER,
    planner_kind: str = opt.PLANNER_KIND,
    tokenizer: str = opt.TOKENIZER,
    prompt: str = typer.Option(None, "--prompt", help="solo/relay policy prompt template."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Token budget of the episode."),
    temperature: float = typer.Option(None, "--temperature", help="0 means greedy."),
    seed: int = typer.Option(None, "--seed", help="Random seed."),
    engine: str = typer.Option(None, "--engine", help="auto, transformers, vllm or openai."),
    api_key: str = typer.Option(None, "--api-key", help="Key of OpenAI-compatible endpoints."),
    served_model: str = typer.Option(None, "--served-model", help="Model name at the endpoint."),
    as_json: bool = typer.Option(False, "--json", help="Print the episode as JSON."),
    config: Path = typer.Option(None, "--config", "-c", help="YAML config file."),
    set_: list[str] = typer.Option(None, "--set", help="Override any config key: key.sub=value."),
) -> None:
    """Run one problem through a protocol and print who wrote what."""
    from collabrl.cli.transcript import print_episode
    from collabrl.config import build_config, read_yaml
    from collabrl.protocols.infer import InferConfig, infer_one

    cli = {
        "model": model,
        "question": question,
        "benchmark": bench,
        "item": item,
        "prompt": prompt,
        "protocol": opt.protocol_layer(
            protocol, teacher, expert, self_collab, planner, planner_kind, tokenizer
        ),
        "sampling": {"max_tokens": max_tokens, "temperature": temperature, "seed": seed},
        "engine": {"kind": engine, "api_key": api_key, "served_model": served_model},
    }
    layers = [read_yaml(config)] if config else []
    cfg = build_config(InferConfig, [*layers, opt.without_none(cli)], set_ or [])
    episode, seconds = infer_one(cfg)
    if as_json:
        print(json.dumps(episode.to_dict(), ensure_ascii=False))
        return
    print_episode(console, episode, seconds)
