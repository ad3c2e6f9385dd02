"""Configuration of `collab serve`."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import ClassVar

from collabrl.config import EngineConfig, option
from collabrl.errors import UserError, require
from collabrl.tools.python import PythonToolConfig
from collabrl.tools.retrieval import RetrievalConfig
from collabrl.tools.toolset import LOCAL_TOOLS

# `tools` serves no model: the Python and retrieval tools over MCP (docs/mcp.md).
ROLES = ("expert", "teacher", "policy", "judge", "planner", "tools")
TRANSPORTS = ("http", "stdio")
SERVE_ENGINES = ("auto", "vllm", "transformers")
# Every request of a batch waits this long for the next one: past a minute, clients time out.
MAX_BATCH_WAIT_MS = 60_000
API_KEY_ENV = "COLLABRL_API_KEY"
# `vllm serve`'s own default share of the GPU: the launcher leaves the flag out at it.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
# What a bearer token can carry in an HTTP header: visible ASCII. An empty key once
# started an open server without a word, and a newline cannot be sent by any client.
_API_KEY = re.compile(r"[\x21-\x7e]+")


@dataclass
class ServeConfig:
    """One model served over the OpenAI-compatible HTTP API."""

    role: str = option("expert", f"What the model is for: {', '.join(ROLES)}.")
    model: str = option("smollm2-135m", "Model reference: embedded name, folder, .gguf, LoRA.")
    engine: EngineConfig = option(
        EngineConfig(gpu_memory_utilization=VLLM_GPU_MEMORY_UTILIZATION),
        "Which engine serves the model: kind vllm (`vllm serve`) | transformers (the "
        "embedded batched server) | auto (by the rule of every command's engine.kind; a "
        "vLLM installed only as a separate command is used when asked for by name); "
        "batch_size is the embedded server's largest batch; device the embedded server's; "
        "dtype and max_model_len both servers'; tensor_parallel_size, "
        "gpu_memory_utilization, kv_cache_mb (vLLM's CPU build) and enforce_eager are "
        "`vllm serve` flags, each left out at vLLM's default.",
    )
    served_model_name: str | None = option(
        None, "Name clients pass as `model` (default: the role, as in EAPO's appendix E)."
    )
    host: str = option("127.0.0.1", "Address to bind; 0.0.0.0 or :: exposes the server.")
    port: int = option(8000, "TCP port.")
    api_key: str | None = option(
        None,
        "Require this key on every endpoint but /health and /metrics (default: $COLLABRL_API_KEY).",
    )
    # embedded (transformers) server
    batch_wait_ms: float = option(
        10.0,
        "A batch closes once no request has come for this long, or when it is full "
        "(embedded server).",
    )
    max_stop_strings: int = option(
        4,
        "Most stop strings one request may name; more is a 400 (OpenAI's limit; each is "
        "checked at every streamed token; embedded server).",
    )
    max_stop_length: int = option(
        512,
        "Most characters of one stop string; a longer one is a 400 (embedded server).",
    )
    access_log: bool = option(
        True,
        "Log one line per request on stderr: method, path, status, model, token counts, "
        "latency (embedded server; vLLM's server logs its own).",
    )
    # vLLM (the engine's flags are under `engine`)
    trust_remote_code: bool = option(
        False, "vllm serve --trust-remote-code: run the model folder's own Python code."
    )
    log_requests: bool = option(False, "Log every request (vLLM's request log).")
    vllm_args: list[str] = option([], "Extra arguments appended to `vllm serve` verbatim.")
    # the tools role: an MCP server
    transport: str = option(
        "http", "tools role: MCP transport, http (streamable HTTP at /mcp) or stdio."
    )
    tools: list[str] = option(list(LOCAL_TOOLS), "tools role: the tools served.")
    python: PythonToolConfig = option(PythonToolConfig(), "tools role: the python tool.")
    retrieval: RetrievalConfig = option(RetrievalConfig(), "tools role: the retrieve tool.")

    # The flat engine keys of 0.1, read for one release (config.py, RENAMED); `engine`
    # first: the scalar becomes the section the others move into.
    RENAMED: ClassVar[dict[str, str]] = {
        "engine": "engine.kind",
        "max_batch_size": "engine.batch_size",
        "dtype": "engine.dtype",
        "device": "engine.device",
        "gpu_memory_utilization": "engine.gpu_memory_utilization",
        "kv_cache_mb": "engine.kv_cache_mb",
        "max_model_len": "engine.max_model_len",
        "tensor_parallel_size": "engine.tensor_parallel_size",
    }

    def check(self) -> None:
        """Refuse an engine, device, dtype, port, batch wait, stop-string limit or API key
        no server runs with, before the model is loaded."""
        if self.engine.kind not in SERVE_ENGINES:
            raise UserError(
                f"collab serve cannot serve with engine '{self.engine.kind}'",
                f"use one of {', '.join(SERVE_ENGINES)}",
            )
        self.engine.check()
        require("port", self.port, 1 <= self.port <= 65535, "a TCP port, 1-65535")
        wait = self.batch_wait_ms
        ok = 0 <= wait <= MAX_BATCH_WAIT_MS  # NaN fails both
        require("batch_wait_ms", wait, ok, f"between 0 and {MAX_BATCH_WAIT_MS} ms")
        length = self.engine.max_model_len
        ok = length is None or length >= 1
        require("engine.max_model_len", length, ok, "a context length in tokens, at least 1")
        for key in ("max_stop_strings", "max_stop_length"):
            require(key, getattr(self, key), getattr(self, key) >= 0, "0 or more")
        self.resolved_api_key()  # a key no client can send, refused before the model loads

    @property
    def name(self) -> str:
        return self.served_model_name or self.role

    def resolved_api_key(self) -> str | None:
        """The key clients must send: `api_key`, else $COLLABRL_API_KEY (an empty one is
        unset, as shells write it), else none; a key no client can send is refused."""
        if self.api_key is not None:
            _check_api_key("api_key", self.api_key)
            return self.api_key
        from_env = os.environ.get(API_KEY_ENV) or None
        if from_env is not None:
            _check_api_key(API_KEY_ENV, from_env)
        return from_env

    @property
    def exposed(self) -> bool:
        """Whether `host` takes connections from other machines (not a loopback address)."""
        if self.host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return True  # a host name: whichever interfaces it names, assume reachable


def _check_api_key(key: str, value: str) -> None:
    """Refuse a key no client can send, without echoing it (it is a secret)."""
    if _API_KEY.fullmatch(value) is None:
        got = "an empty one" if not value else "one with spaces, controls or non-ASCII"
        raise UserError(
            f"{key} must be printable ASCII without spaces (a bearer token), got {got}",
            "e.g. the output of `openssl rand -hex 16`",
        )
