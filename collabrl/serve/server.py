"""Run a model behind the OpenAI-compatible API: vLLM on a GPU, embedded otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from collabrl.errors import UserError
from collabrl.serve.config import ServeConfig

if TYPE_CHECKING:
    from collabrl.serve.batcher import DynamicBatcher


def choose_engine(config: ServeConfig) -> str:
    """vllm or transformers (the embedded server): `engine.kind` resolved by the rule every
    command follows (`engines.resolve_kind`: auto is vLLM where it can run here)."""
    from collabrl.engines import is_url, resolve_kind
    from collabrl.models import resolve_model

    if is_url(config.model):
        raise UserError(
            f"collab serve serves a local model, not the endpoint {config.model}",
            "pass --model a model name, folder or file",
        )
    resolve_model(config.model)  # a mistyped model or one without weights, before any load
    return resolve_kind(config.model, config.engine)


def check_address(host: str, port: int) -> None:
    """Refuse a host this machine cannot listen on, or a port in use, before the model
    loads (uvicorn would find out only after, and log it on a line of its own)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as err:
        raise UserError(
            f"cannot listen on {host}:{port}: {err.strerror or err}",
            "pick a free --port, and a --host of this machine (127.0.0.1, 0.0.0.0, ::)",
        ) from err


def base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/v1"


def served_context(model: int | None, asked: int | None) -> int | None:
    """The context the server allows: `engine.max_model_len` when set, which may not
    exceed the model's (vLLM refuses that too), else the model's own."""
    if asked is None:
        return model
    if model is not None and asked > model:
        raise UserError(
            f"engine.max_model_len {asked} is longer than the model's context of {model} tokens",
            f"pass --max-model-len {model} or less",
        )
    return asked


def serve_embedded(config: ServeConfig, on_ready: Callable[[str], None]) -> None:
    """Load the model, serve it with dynamic batching until SIGINT/SIGTERM."""
    import uvicorn

    from collabrl.engines.hf import TransformersEngine
    from collabrl.serve.app import create_app
    from collabrl.serve.batcher import DynamicBatcher
    from collabrl.serve.inputs import ModelLimits
    from collabrl.serve.stops import StopLimits

    check_address(config.host, config.port)
    settings = config.engine
    engine = TransformersEngine.from_ref(
        config.model,
        batch_size=settings.batch_size,
        dtype=settings.dtype,
        device=settings.device,
    )
    batcher = DynamicBatcher(engine, settings.batch_size, config.batch_wait_ms / 1000)
    limits = ModelLimits.of(
        engine.tokenizer, served_context(engine.context_length, settings.max_model_len)
    )
    app = create_app(
        batcher,
        limits,
        config.name,
        config.resolved_api_key(),
        (config.model,),
        sys.stderr if config.access_log else None,
        StopLimits(config.max_stop_strings, config.max_stop_length),
    )
    server = _graceful_server_class()(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            # A backstop only: the batcher answers every open request at once on a stop.
            timeout_graceful_shutdown=5,
        ),
        batcher,
    )

    async def announce_when_started() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        on_ready(base_url(config.host, config.port))

    async def main() -> None:
        announcer = asyncio.create_task(announce_when_started())
        await server.serve()  # uvicorn handles SIGINT/SIGTERM: drains, then returns
        announcer.cancel()

    try:
        asyncio.run(main())
    except SystemExit:  # uvicorn exits when it cannot bind; its log line says why
        pass
    if not server.started:
        raise UserError(
            f"could not listen on {config.host}:{config.port}",
            "is the port in use? pick another with --port",
        )


def _graceful_server_class():
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """Stops on SIGINT/SIGTERM within seconds and returns normally.

        uvicorn waits for open requests before it shuts the app down, and a request
        waits for its generation: minutes on a busy server. So the batcher stops
        first — queued and running requests are answered 503 (clients retry
        elsewhere), the generation in progress ends at its next token; a second
        Ctrl-C adds nothing (uvicorn's forced exit logged a traceback). uvicorn also
        re-raises the caught signal after draining, which turns a clean shutdown into
        a "killed by signal" exit status; this server does not.
        """

        def __init__(self, config: uvicorn.Config, batcher: DynamicBatcher) -> None:
            super().__init__(config)
            self.batcher = batcher

        def handle_exit(self, sig: int, frame: object) -> None:
            # uvicorn makes a second Ctrl-C a forced exit, which skips the app's shutdown
            # and logs the cancelled lifespan's traceback. This shutdown takes seconds
            # anyway (the batcher answers every open request at once): a repeat changes
            # nothing.
            self.should_exit = True

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await self.batcher.stop()
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            stops = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return GracefulServer
