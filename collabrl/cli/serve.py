"""`collab serve ROLE`: serve a model over the OpenAI-compatible API."""

from __future__ import annotations

from pathlib import Path

import typer

from collabrl.cli import options as opt
from collabrl.cli.console import make_console

console = make_console()


def serve(
    ctx: typer.Context,
    role: str = opt.config_argument("role"),
    model: str = opt.MODEL,
    engine: str = opt.ENGINE,
    host: str = opt.config_option("host", "--host"),
    port: int = opt.config_option("port", "--port"),
    api_key: str = opt.config_option("api_key", "--api-key"),
    served_model_name: str = opt.config_option("served_model_name", "--served-model-name"),
    tensor_parallel_size: int = opt.config_option(
        "engine.tensor_parallel_size", "--tensor-parallel-size"
    ),
    gpu_memory_utilization: float = opt.config_option(
        "engine.gpu_memory_utilization", "--gpu-memory-utilization"
    ),
    max_model_len: int = opt.config_option("engine.max_model_len", "--max-model-len"),
    dtype: str = opt.config_option("engine.dtype", "--dtype"),
    enforce_eager: bool = opt.config_option("engine.enforce_eager", "--enforce-eager"),
    trust_remote_code: bool = opt.config_option("trust_remote_code", "--trust-remote-code"),
    batch_size: int = opt.BATCH_SIZE,
    max_batch_size: int = opt.renamed_option("engine.batch_size", "--max-batch-size"),  # 0.1
    device: str = opt.DEVICE,
    transport: str = opt.config_option("transport", "--transport"),
    tool: list[str] = opt.config_option("tools", "--tool"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run, then exit."),
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """Serve a model: `vllm serve` on a GPU, the embedded batched server on a CPU.
    `collab serve tools` serves the Python and retrieval tools over MCP instead."""
    from collabrl.engines import resolve_kind
    from collabrl.errors import UserError
    from collabrl.serve.config import ROLES
    from collabrl.serve.server import choose_engine, serve_embedded

    opt.note_renamed("--max-batch-size", "--batch-size", max_batch_size)
    # The options above reach the config through ctx (see cli/options.py), by their keys.
    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)
    if cfg.role not in ROLES:
        raise UserError(f"unknown role '{cfg.role}'", f"use one of {', '.join(ROLES)}")
    if dry_run:  # a real start warns once it listens (`announce`)
        _warn_if_open(cfg)
    if cfg.role == "tools":
        _serve_tools(cfg, dry_run)
        return
    # A dry run needs no weights, as `train --dry-run`: a model not on this machine (a
    # cluster's path, from a laptop) is a warning and the command names it as typed.
    missing = dry_run and _warn_if_missing(cfg.model)
    kind = resolve_kind(cfg.model, cfg.engine) if missing else choose_engine(cfg)
    if kind == "vllm":
        _serve_vllm(cfg, dry_run, missing)
        return
    if dry_run:
        console.print(
            f"embedded server: {cfg.model} as '{cfg.name}' on {cfg.host}:{cfg.port}, "
            f"batches of up to {cfg.engine.batch_size}, auth "
            f"{'on' if cfg.resolved_api_key() else 'off'}"
        )
        return
    console.print(f"loading {cfg.model} …")

    def announce(url: str) -> None:
        _warn_if_open(cfg)
        console.print(f"ready: {url} (model '{cfg.name}'; Ctrl-C to stop)", highlight=False)

    serve_embedded(cfg, on_ready=announce)
    console.print("stopped")


def _warn_if_open(cfg) -> None:
    """One line on stderr when the server takes anyone's requests: reachable from other
    machines (--host 0.0.0.0) and no key asked for. Said once it listens, so that a
    server that cannot start says one thing: why."""
    from collabrl.serve.config import API_KEY_ENV

    stdio = cfg.role == "tools" and cfg.transport == "stdio"  # only its launcher talks to it
    if stdio or not cfg.exposed or cfg.resolved_api_key() is not None:
        return
    what = "run code in the python tool" if cfg.role == "tools" else "use the model"
    make_console(stderr=True).print(
        f"[yellow]warning:[/] --host {cfg.host} without an API key: anyone who can reach this "
        f"machine can {what}; pass --api-key or set {API_KEY_ENV}",
        highlight=False,
        soft_wrap=True,
    )


def _warn_if_missing(model: str) -> bool:
    """In a dry run: whether `model` is not on this machine, said in one line on stderr
    with where it was looked for. A URL is left to `choose_engine`, which refuses it."""
    from rich.markup import escape

    from collabrl.engines import is_url
    from collabrl.errors import UserError
    from collabrl.models import resolve_model

    if is_url(model):
        return False
    try:
        resolve_model(model)
    except UserError as err:
        make_console(stderr=True).print(
            f"[yellow]warning:[/] {escape(err.problem)}; this dry run shows what would run "
            "where it is",
            highlight=False,
            soft_wrap=True,
        )
        return True
    return False


def _serve_tools(cfg, dry_run: bool) -> None:
    """The tools over MCP: stdio for a client that launches us, HTTP for anyone else."""
    from collabrl.errors import UserError
    from collabrl.serve.config import TRANSPORTS
    from collabrl.serve.server import check_address
    from collabrl.tools.mcp_server import serve_tools
    from collabrl.tools.toolset import build_tools, check_tool_names

    if cfg.transport not in TRANSPORTS:
        raise UserError(f"unknown transport '{cfg.transport}'", f"use {' or '.join(TRANSPORTS)}")
    check_tool_names(cfg.tools)
    where = "stdio" if cfg.transport == "stdio" else f"http://{cfg.host}:{cfg.port}/mcp"
    if dry_run:
        console.print(f"MCP server: tools {', '.join(cfg.tools)} over {where}")
        return
    if cfg.transport == "http":
        check_address(cfg.host, cfg.port)
    # Over stdio, stdout is the protocol's channel: every word for people goes to stderr.
    say = make_console(stderr=True)

    def announce(address: str) -> None:
        _warn_if_open(cfg)
        say.print(
            f"ready: {address} (tools {', '.join(cfg.tools)}; Ctrl-C to stop)", highlight=False
        )

    tools = build_tools(cfg.tools, cfg.python, cfg.retrieval)
    try:
        serve_tools(
            tools,
            cfg.transport,
            cfg.host,
            cfg.port,
            cfg.resolved_api_key(),
            on_ready=announce,
        )
    except KeyboardInterrupt:
        pass  # Ctrl-C is how this server is meant to stop (uvicorn re-raises it once drained)
    finally:
        for tool in tools:
            tool.close()
    say.print("stopped")


def _serve_vllm(cfg, dry_run: bool, missing: bool) -> None:
    """`vllm serve` the model; `missing`: a dry run's model not on this machine, which
    the command names as typed (no adapter or conversion can be known without it)."""
    from collabrl.engines.vllm import installed_vllm
    from collabrl.serve.vllm_launcher import (
        check_vllm_ready,
        launch_vllm,
        lora_adapter_for,
        lora_note,
        model_path_for,
        shell_line,
        vllm_command,
    )

    if not dry_run:
        check_vllm_ready()  # before converting any weights
    lora = None if missing else lora_adapter_for(cfg.model)
    distribution, version = installed_vllm() or ("vllm", None)
    command = vllm_command(
        cfg,
        cfg.model if missing else model_path_for(cfg.model, convert=not dry_run),
        version,
        api_key=cfg.resolved_api_key(),
        lora=lora,
        distribution=distribution,
    )
    if lora is not None:
        console.print(lora_note(cfg.name))
    if dry_run:
        print(shell_line(command))
        return
    _warn_if_open(cfg)
    raise typer.Exit(launch_vllm(command))
