"""`collab serve ROLE`: serve a model over the OpenAI-compatible API."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def serve(
    role: str = typer.Argument("expert", help="expert, teacher, policy, judge or planner."),
    model: str = typer.Option(None, "--model", "-m", help="Model reference to serve."),
    engine: str = typer.Option(None, "--engine", help="vllm, transformers or auto."),
    host: str = typer.Option(None, "--host", help="Bind address (default 127.0.0.1)."),
    port: int = typer.Option(None, "--port", help="TCP port (default 8000)."),
    api_key: str = typer.Option(None, "--api-key", help="Require this key (or $COLLABRL_API_KEY)."),
    served_model_name: str = typer.Option(None, "--served-model-name", help="Default: ROLE."),
    tensor_parallel_size: int = typer.Option(None, "--tensor-parallel-size", help="vLLM GPUs."),
    max_batch_size: int = typer.Option(None, "--max-batch-size", help="Embedded server batch."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run, then exit."),
    config: Path = typer.Option(None, "--config", "-c", help="YAML config file."),
    set_: list[str] = typer.Option(None, "--set", help="Override any config key: key=value."),
) -> None:
    """Serve a model: `vllm serve` on a GPU, the embedded batched server on a CPU."""
    from collabrl.cli.options import without_none
    from collabrl.config import build_config, read_yaml
    from collabrl.errors import UserError
    from collabrl.serve.config import ROLES, ServeConfig
    from collabrl.serve.server import choose_engine, resolve_api_key, serve_embedded

    if role not in ROLES:
        raise UserError(f"unknown role '{role}'", f"use one of {', '.join(ROLES)}")
    cli = {
        "role": role,
        "model": model,
        "engine": engine,
        "host": host,
        "port": port,
        "api_key": api_key,
        "served_model_name": served_model_name,
        "tensor_parallel_size": tensor_parallel_size,
        "max_batch_size": max_batch_size,
    }
    layers = [read_yaml(config)] if config else []
    cfg = build_config(ServeConfig, [*layers, without_none(cli)], set_ or [])
    kind = choose_engine(cfg)
    if kind == "vllm":
        _serve_vllm(cfg, dry_run)
        return
    if dry_run:
        console.print(
            f"embedded server: {cfg.model} as '{cfg.name}' on {cfg.host}:{cfg.port}, "
            f"batches of up to {cfg.max_batch_size}, auth "
            f"{'on' if resolve_api_key(cfg) else 'off'}"
        )
        return
    console.print(f"loading {cfg.model} …")
    serve_embedded(
        cfg,
        on_ready=lambda url: console.print(
            f"ready: {url} (model '{cfg.name}'; Ctrl-C to stop)", highlight=False
        ),
    )
    console.print("stopped")


def _serve_vllm(cfg, dry_run: bool) -> None:
    from collabrl.serve.server import resolve_api_key
    from collabrl.serve.vllm_launcher import (
        check_vllm_ready,
        installed_vllm_version,
        launch_vllm,
        lora_adapter_for,
        lora_note,
        model_path_for,
        shell_line,
        vllm_command,
    )

    if not dry_run:
        check_vllm_ready()  # before converting any weights
    lora = lora_adapter_for(cfg.model)
    command = vllm_command(
        cfg,
        model_path_for(cfg.model, convert=not dry_run),
        installed_vllm_version(),
        api_key=resolve_api_key(cfg),
        lora=lora,
    )
    if lora is not None:
        console.print(lora_note(cfg.name))
    if dry_run:
        print(shell_line(command))
        return
    raise typer.Exit(launch_vllm(command))
