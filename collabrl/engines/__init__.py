"""Text generation behind one interface (see `base.Engine`), and the factory."""

from __future__ import annotations

from collabrl.config import EngineConfig
from collabrl.engines.base import Completion, Engine, Prompt, SamplingParams
from collabrl.errors import UserError

__all__ = ["Completion", "Engine", "Prompt", "SamplingParams", "create_engine", "is_url"]

ENGINE_KINDS = ("auto", "transformers", "vllm", "openai")


def is_url(ref: str) -> bool:
    return ref.startswith(("http://", "https://"))


def create_engine(model: str, config: EngineConfig) -> Engine:
    """Build the engine for a model reference or an endpoint base URL."""
    kind = config.kind
    if kind not in ENGINE_KINDS:
        raise UserError(f"unknown engine '{kind}'", f"use one of {', '.join(ENGINE_KINDS)}")
    if kind == "auto":
        kind = "openai" if is_url(model) else "transformers"
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
        from collabrl.engines.vllm import VLLMEngine

        return VLLMEngine(
            model,
            dtype="auto" if config.dtype == "float32" else config.dtype,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_model_len=config.max_model_len,
            chat_template_kwargs=config.chat_template_kwargs,
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
