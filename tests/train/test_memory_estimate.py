"""The memory estimate's terms (issue 32): the reference model counted exactly when TRL
loads one, activations and the LM head in the dtype the run computes in, TRL's chunked
head instead of whole logits, and paper models sized from the shapes shipped for them.
bench/memory_estimate.py holds the estimate against measured peaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl.config import build_config, read_yaml
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.plan import (
    GIB,
    SHAPES,
    ModelShape,
    estimate_memory,
    model_shape,
    plan_run,
    shipped_shape,
)

CONFIGS = Path(__file__).parents[2] / "configs" / "train"
SHAPE = ModelShape(
    parameters=GIB, hidden_size=1000, layers=10, vocab_size=50_000, intermediate_size=3000
)


def _estimate(**changes):
    settings = dict(
        micro_batch=2,
        sequence=100,
        checkpointing=False,
        world_size=8,
        zero_stage=0,
        vllm_fraction=None,
    )
    return estimate_memory(SHAPE, **(settings | changes))


def _rows(config: GRPOTrainConfig) -> dict[str, str]:
    return {key: value for rows in plan_run(config).sections.values() for key, value in rows}


def test_the_reference_model_is_counted_when_trl_loads_one() -> None:
    assert _estimate(reference=False).reference == 0
    # TRL builds it in the policy's dtype: fp32, as collabrl loads the policy.
    assert _estimate(reference=True).reference == 4
    # DeepSpeed in bf16 casts it to bf16; ZeRO-3 shards it over the 8 processes.
    assert _estimate(reference=True, zero_stage=2).reference == 2
    assert _estimate(reference=True, zero_stage=3).reference == 2 / 8
    assert _estimate(reference=True, bf16=False, zero_stage=3).reference == 4 / 8
    # With LoRA the adapter is disabled instead, and only the adapter trains.
    lora = _estimate(reference=True, lora=True)
    assert (lora.reference, lora.weights, lora.gradients, lora.optimizer) == (0, 4, 0, 0)
    assert _estimate(reference=True).training == pytest.approx(_estimate().training + 4)


def test_activations_and_the_lm_head_are_in_the_runs_dtype() -> None:
    tokens = 2 * 100
    # bf16: 10 hidden-wide and 4 MLP-wide tensors a layer, the norms' 4 in fp32.
    per_layer = (10 * 1000 + 4 * 3000) * 2 + 4 * 1000 * 2
    assert _estimate().activations == pytest.approx(tokens * 10 * per_layer / GIB)
    fp32 = (10 * 1000 + 4 * 3000) * 4
    assert _estimate(bf16=False).activations == pytest.approx(tokens * 10 * fp32 / GIB)
    # TRL's head: one tile (200 tokens × 32768 of the vocabulary) in the compute dtype,
    # plus the fp32 gradients of the head's weight and of the hidden states.
    head = (50_000 + tokens) * 1000 * 4
    assert _estimate().logits == pytest.approx((tokens * 32768 * 2 + head) / GIB)
    # Without Triton (a CPU), torch ops hold 6 fp32 tiles besides the fp32 tile.
    cpu = _estimate(bf16=False, triton=False).logits
    assert cpu == pytest.approx((tokens * 32768 * (4 + 6 * 4) + head) / GIB)
    # Never the whole micro-batch × sequence × vocabulary logits: tiles of 4096 tokens.
    long = _estimate(micro_batch=16, sequence=9216).logits
    whole = 16 * 9216 * 50_000 * 2 / GIB
    assert long == pytest.approx((4096 * 32768 * 2 + (50_000 + 16 * 9216) * 1000 * 4) / GIB)
    assert long < whole / 5


def test_paper_models_are_sized_from_their_shipped_shapes() -> None:
    r1 = model_shape("./DeepSeek-R1-Distill-Qwen-7B")
    assert r1 is not None and r1.source.startswith("the shipped shape")
    assert round(r1.parameters / 1e9, 2) == 7.62  # not the name's 7
    assert (r1.hidden_size, r1.intermediate_size, r1.vocab_size) == (3584, 18944, 152064)
    # A run folder named after its base model, and an -Instruct of the same shape.
    assert model_shape("runs/sft-relay-qwen3-1.7b/final").parameters == 1_720_574_976
    assert shipped_shape("Qwen/Qwen2.5-0.5B-Instruct").parameters == 494_032_768
    assert shipped_shape("./Qwen2.5-7B").parameters == r1.parameters
    assert shipped_shape("./Qwen2.5-70B") is None and shipped_shape("my-qwen3-1.7b2") is None
    assert model_shape("./Llama-3-8B").source == "its name"  # nothing shipped: the name


def test_shipped_shapes_load_with_autoconfig() -> None:
    from transformers import AutoConfig

    for folder in (f for f in SHAPES.iterdir() if f.is_dir()):
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        assert config.model_type in ("qwen2", "qwen3")


def test_the_dry_run_shows_every_term() -> None:
    relay = build_config(GRPOTrainConfig, [read_yaml(CONFIGS / "relay-qwen3-1.7b.yaml")])
    rows = _rows(relay)
    assert rows["parameters"] == "1.72 B (from the shipped shape shapes/Qwen3-1.7B)"
    reference = 1_720_574_976 * 4 / GIB  # beta 0.01, one process: an fp32 copy
    assert rows["reference model"] == f"{reference:.1f} GiB (beta 0.01)"
    assert any(key.startswith("activations (2 × ") for key in rows)
    assert any(key.startswith("log-probs (TRL's chunked LM head") for key in rows)
    assert "training total" in rows
    eapo = build_config(GRPOTrainConfig, [read_yaml(CONFIGS / "eapo-r1-distill-7b.yaml")])
    assert _rows(eapo)["reference model"] == "none (beta 0)"


@pytest.mark.slow
def test_the_bench_holds_the_estimate_within_its_tolerance() -> None:
    """One method at one size of bench/memory_estimate.py: two real steps in a child
    process, their peak resident memory against the dry run's figure."""
    import subprocess
    import sys

    bench = Path(__file__).parents[2] / "bench" / "memory_estimate.py"
    command = [sys.executable, str(bench), "--methods", "grpo", "--sizes", "small"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "grpo   small" in done.stdout
