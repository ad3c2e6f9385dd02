"""vLLM offline engine (GPU). vLLM is imported only when this engine is built."""

from __future__ import annotations

from typing import Any

from collabrl.engines.base import (
    Completion,
    Prompt,
    SamplingParams,
    cut_at_stop,
    encode_prompt,
)
from collabrl.errors import UserError


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
    ) -> None:
        llm_class = _import_vllm().LLM
        from collabrl.models import load_tokenizer, resolve_model, weights_dir

        model_ref = resolve_model(ref)
        kwargs: dict[str, Any] = {
            "model": str(weights_dir(model_ref)),
            "dtype": dtype,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "seed": seed,
        }
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if model_ref.kind == "lora":
            kwargs["enable_lora"] = True
        self.llm = llm_class(**kwargs)
        self.tokenizer = load_tokenizer(model_ref)
        self._lora = model_ref.source if model_ref.kind == "lora" else None
        self.name = f"vllm:{ref}"

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        vllm = _import_vllm()
        token_prompts = [{"prompt_token_ids": self.encode(p)} for p in prompts]
        outputs = self.llm.generate(
            token_prompts,
            sampling_params=to_vllm_params(vllm.SamplingParams, params),
            use_tqdm=False,
            lora_request=self._lora_request(vllm),
        )
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
