"""`collab infer PROMPT`: send one prompt to a model or endpoint and print the reply."""

from __future__ import annotations

import time

import typer
from rich.console import Console

console = Console()


def infer(
    prompt: str = typer.Argument(..., help="The user message."),
    model: str = typer.Option("smollm2-135m", "--model", "-m", help="Model reference or URL."),
    system: str = typer.Option(None, "--system", help="Optional system message."),
    max_tokens: int = typer.Option(256, "--max-tokens", help="Maximum new tokens."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 means greedy."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    engine: str = typer.Option("auto", "--engine", help="auto, transformers, vllm or openai."),
    api_key: str = typer.Option(None, "--api-key", help="Key of an OpenAI-compatible endpoint."),
    served_model: str = typer.Option(None, "--served-model", help="Model name at the endpoint."),
) -> None:
    """Ask one model one question (a quick check that a model or server works)."""
    from collabrl.config import EngineConfig
    from collabrl.engines import SamplingParams, create_engine

    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    llm = create_engine(
        model, EngineConfig(kind=engine, api_key=api_key, served_model=served_model)
    )
    try:
        began = time.perf_counter()
        [[reply]] = llm.generate([messages], params)
        seconds = time.perf_counter() - began
    finally:
        llm.close()
    console.print(reply.text, highlight=False, markup=False)
    tokens = f"{reply.completion_tokens} tokens, " if reply.completion_tokens else ""
    console.print(f"[dim]{llm.name} · {tokens}{seconds:.2f} s · finish: {reply.finish_reason}[/]")
