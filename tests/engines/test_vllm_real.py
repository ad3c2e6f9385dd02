"""The real vLLM engine, where vLLM is installed (a GPU machine, or vLLM's CPU build).

Its sampling log-probs must be those of the distribution each token was drawn from —
logits divided by the temperature — as the transformers engine's and TRL's
importance-sampling correction are: recomputed here with a plain forward pass.
Skipped where vLLM is not installed (this project's CI); run with `-m slow`.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

pytestmark = pytest.mark.slow

TEMPERATURE = 0.7


def test_vllm_log_probs_are_the_sampling_distributions() -> None:
    import torch

    from collabrl.engines.base import SamplingParams
    from collabrl.engines.vllm import VLLMEngine
    from collabrl.models import load_model, resolve_model

    engine = VLLMEngine("smollm2-135m", dtype="float32", gpu_memory_utilization=0.3)
    prompt = engine.encode([{"role": "user", "content": "What is 12 + 30? Answer briefly."}])
    params = SamplingParams(max_tokens=24, temperature=TEMPERATURE, seed=3, logprobs=True)
    [[completion]] = engine.generate([prompt], params)
    engine.close()
    model = load_model(resolve_model("smollm2-135m"))
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = torch.tensor(completion.token_ids).unsqueeze(-1)
    expected = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, chosen).squeeze(-1)
    torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-3, rtol=0)
