"""The policy trains on the prompt it is evaluated on: for every protocol a run trains
with, the prompt ids the training rollout hands TRL equal those `collab eval` records
for the same problem and config, chat-template options included (issue 22: Qwen3
trained in thinking mode while evaluation ran with `enable_thinking: false`).

The model's tokenizer carries a chat template that reads `enable_thinking`, as Qwen3's
does (`tests/engines/templates.py`); the config turns it off, so a path that drops the
option renders a different prompt. Both sides generate a few tokens on the tiny model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from collabrl import runs
from collabrl.config import DecodingConfig, EngineConfig, SamplingConfig
from collabrl.data.benchmarks import load_benchmark
from collabrl.eval.config import EvalConfig
from collabrl.eval.runner import run_eval
from collabrl.models import load_model, load_tokenizer
from collabrl.protocols import registry
from collabrl.protocols.apollo import ApolloConfig
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.consult_config import ConsultConfig, turn_tokens
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.prompt_length import prompt_lengths
from collabrl.train.resolve import resolve_run
from collabrl.train.trainer import training_rollout
from tests.engines.templates import EMPTY_THINK, thinking_model_dir
from tests.engines.test_vllm import _stand_in, _StandInLLM

NO_THINKING = EngineConfig(chat_template_kwargs={"enable_thinking": False})
DATA = "arith_train"


@pytest.fixture(scope="module")
def thinking_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return thinking_model_dir(tiny_model_dir, tmp_path_factory.mktemp("parity") / "model")


BUILTIN = [spec.name for spec in registry.BUILTIN]
# Those whose prompt is known before the protocol runs (apollo's lists its tools' schemas).
COUNTED = [spec.name for spec in registry.BUILTIN if spec.template or not spec.own_prompt]


def _protocols(planner: Path) -> dict[str, tuple[str, ProtocolConfig]]:
    """Every protocol training rolls out on: its method and its collaborators."""
    return {
        "solo": ("grpo", ProtocolConfig()),
        "relay": ("relay", ProtocolConfig(teacher="reference")),
        # One expert of one token: the smallest turn `collab train eapo` accepts.
        "consult": ("eapo", ProtocolConfig(experts=["reference"], consult=ONE_EXPERT)),
        "strategy": ("rsim", ProtocolConfig(planner=str(planner))),
        "apollo": ("grpo", ProtocolConfig(name="apollo", apollo=ApolloConfig(tools=["python"]))),
    }


ONE_EXPERT = ConsultConfig(num_experts=1, expert_max_tokens=1)


def _config(model: Path, method: str, protocol: ProtocolConfig) -> GRPOTrainConfig:
    # eapo's episode holds a full consult turn (`check_turn_fits`); the others 4 tokens.
    budget = turn_tokens(dataclasses.replace(ONE_EXPERT, mode="open")) if method == "eapo" else 4
    return GRPOTrainConfig(
        method=method,
        model=str(model),
        data=DATA,
        limit=1,
        sampling=DecodingConfig(n=2, max_tokens=budget, temperature=1.0),
        protocol=protocol,
        engine=NO_THINKING,
    )


def _trainer(model, use_vllm: bool = False) -> SimpleNamespace:
    """The parts of a GRPOTrainer the rollout reads, on one process without DeepSpeed."""
    return SimpleNamespace(
        use_vllm=use_vllm,
        model_wrapped=model,
        accelerator=SimpleNamespace(
            process_index=0, unwrap_model=lambda m: m, state=SimpleNamespace(deepspeed_plugin=None)
        ),
        args=SimpleNamespace(gradient_checkpointing_kwargs=None, vllm_mode="colocate"),
        vllm_generation=SimpleNamespace(llm=_StandInLLM()),
        state=SimpleNamespace(global_step=0),
        callback_handler=SimpleNamespace(callbacks=[]),
        _step=0,
    )


def _training_prompt_ids(config: GRPOTrainConfig, use_vllm: bool = False) -> list[int]:
    """The prompt ids the run's rollout gives TRL for the first problem."""
    bench = load_benchmark(config.data, limit=config.limit)
    model, tokenizer = load_model(config.model), load_tokenizer(config.model)
    rollout = training_rollout(resolve_run(config), bench, model, tokenizer)
    try:
        out = rollout([bench.items[0].id] * 2, _trainer(model, use_vllm))
    finally:
        rollout.protocol.close()
    return out["prompt_ids"][0]


def _eval_prompt_ids(config: GRPOTrainConfig, out: Path) -> list[int]:
    """The prompt ids `collab eval` records for the first problem, with the run's model,
    protocol, prompt and engine options (as the run's own held-out evaluation)."""
    bench = load_benchmark(config.data, limit=config.limit)
    run = resolve_run(config)
    eval_config = EvalConfig(
        benchmark=config.data,
        model=config.model,
        prompt=run.prompt(bench.prompt),
        limit=1,
        out=str(out),
        protocol=run.protocol,
        sampling=SamplingConfig(max_tokens=config.sampling.max_tokens),
        engine=dataclasses.replace(config.engine),
    )
    run_eval(eval_config)
    (record,) = runs.read_records(out / runs.SAMPLES)
    return record["episode"]["prompt_ids"]


@pytest.mark.parametrize("protocol", BUILTIN)
def test_training_prompts_are_the_evaluation_prompts(
    thinking_dir: Path, tiny_model_dir: Path, tmp_path: Path, protocol: str
) -> None:
    method, protocol_config = _protocols(tiny_model_dir)[protocol]
    config = _config(thinking_dir, method, protocol_config)
    trained = _training_prompt_ids(config)
    evaluated = _eval_prompt_ids(config, tmp_path / "eval")
    assert trained == evaluated
    # The option reached the template on both sides (not merely dropped on both).
    assert load_tokenizer(str(thinking_dir)).decode(trained).endswith(EMPTY_THINK)


def test_with_trls_vllm_the_prompts_are_the_evaluation_prompts(
    monkeypatch: pytest.MonkeyPatch, thinking_dir: Path, tmp_path: Path
) -> None:
    _stand_in(monkeypatch, "0.11.0")  # TRL's colocated vLLM, a stand-in that answers [5, 2]
    config = _config(thinking_dir, "grpo", ProtocolConfig())
    trained = _training_prompt_ids(config, use_vllm=True)
    assert trained == _eval_prompt_ids(config, tmp_path / "eval")


@pytest.mark.parametrize("protocol", COUNTED)
def test_the_prompt_limit_counts_the_ids_the_rollout_gives_trl(
    thinking_dir: Path, tiny_model_dir: Path, protocol: str
) -> None:
    """max_prompt_tokens drops a problem on the length of the very prompt the rollout
    renders for it (the protocol's template, the chat-template options)."""
    method, protocol_config = _protocols(tiny_model_dir)[protocol]
    config = _config(thinking_dir, method, protocol_config)
    bench = load_benchmark(config.data, limit=config.limit)
    assert prompt_lengths(resolve_run(config), bench) == [len(_training_prompt_ids(config))]
