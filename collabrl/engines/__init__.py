"""Text generation behind one interface (see `base.Engine`), and the factory."""

from __future__ import annotations

import os

from collabrl.config import ENGINE_KINDS, EngineConfig
from collabrl.engines.base import Completion, Engine, Prompt, SamplingParams
from collabrl.errors import UserError

__all__ = [
    "Completion",
    "Engine",
    "Prompt",
    "SamplingParams",
    "create_engine",
    "is_url",
    "resolve_kind",
]

# `engine: auto` for a local model: "transformers" keeps it off vLLM even where vLLM runs.
AUTO_ENGINE_ENV = "COLLABRL_AUTO_ENGINE"


def is_url(ref: str) -> bool:
    return ref.startswith(("http://", "https://"))


def resolve_kind(model: str, config: EngineConfig, collaborator: bool = False) -> str:
    """The engine `config.kind` means for `model`, `auto` resolved: openai for a URL;
    for a local model vLLM where it is installed and has a device (a GPU, or its CPU
    build, which in float32 decoded 1.5x faster than the transformers engine here:
    docs/benchmarks.md), otherwise transformers. A local `collaborator` (a teacher or
    expert the pool loads in the policy's process) runs on vLLM only when `vllm` is
    asked for: under auto a second vLLM beside the policy's would reserve most of the
    GPU's memory again."""
    kind = config.kind
    if kind not in ENGINE_KINDS:
        raise UserError(f"unknown engine '{kind}'", f"use one of {', '.join(ENGINE_KINDS)}")
    if collaborator and not is_url(model):
        return "vllm" if kind == "vllm" else "transformers"
    if kind != "auto":
        return kind
    if is_url(model):
        return "openai"
    if os.environ.get(AUTO_ENGINE_ENV) == "transformers":
        return "transformers"
    from collabrl.engines.vllm import vllm_can_run

    return "vllm" if vllm_can_run() else "transformers"


def vllm_dtype(dtype: str, cpu_build: bool) -> str:
    """vLLM's dtype for `engine.dtype`: `auto` on vLLM's CPU build is float32, its fastest
    dtype there (vLLM's own `auto`, bfloat16, ran at a third of the speed); on a GPU,
    vLLM's own `auto`."""
    from collabrl.devices import resolve_dtype

    return resolve_dtype(dtype, "cpu") if cpu_build else dtype


def create_engine(model: str, config: EngineConfig) -> Engine:
    """Build the engine for a model reference or an endpoint base URL."""
    kind = resolve_kind(model, config)
    if kind == "openai":
        if not is_url(model):
            raise UserError(
                f"the openai engine needs a base URL, got '{model}'",
                "pass e.g. --model http://127.0.0.1:8000/v1",
            )
        from collabrl.engines.openai_http import OpenAIEngine

        return OpenAIEngine(
            model,
            model=config.served_model,
            api_key=config.api_key,
            max_concurrency=config.max_concurrency,
            timeout=config.timeout,
            max_retries=config.max_retries,
            chat_template_kwargs=config.chat_template_kwargs,
        )
    if is_url(model):
        raise UserError(
            f"the {kind} engine runs a local model, got URL '{model}'",
            "use --engine openai for endpoints",
        )
    if kind == "vllm":
        from collabrl.engines.vllm import VLLMEngine, is_cpu_build

        cpu = is_cpu_build()
        return VLLMEngine(
            model,
            dtype=vllm_dtype(config.dtype, cpu),
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_model_len=config.max_model_len,
            chat_template_kwargs=config.chat_template_kwargs,
            enforce_eager=config.enforce_eager,
            kv_cache_mb=config.kv_cache_mb if cpu else None,
        )
    from collabrl.engines.hf import TransformersEngine

    return TransformersEngine.from_ref(
        model,
        batch_size=config.batch_size,
        dtype=config.dtype,
        device=config.device,
        prefix_cache=config.prefix_cache,
        chat_template_kwargs=config.chat_template_kwargs,
        prefix_cache_mb=config.prefix_cache_mb,
        continuous=config.continuous_batching,
    )
