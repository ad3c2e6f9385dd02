"""The dry run's arithmetic beyond the trained policy (issue 50), by hand on the shape
shipped for EAPO's policy: a colocated vLLM's KV cache in sequences of its length,
what the periodic evaluation holds, and a checkpoint's bytes per parameter."""

from __future__ import annotations

import pytest

from collabrl.train.memory import (
    GB,
    GIB,
    SHAPES,
    VLLM_FIXED_GIB,
    ModelShape,
    checkpoint_size,
    estimate_eval,
    estimate_memory,
    estimate_vllm,
    kv_token_bytes,
    room_for_vllm,
    shape_from_config,
)

R1_7B = shape_from_config(SHAPES / "DeepSeek-R1-Distill-Qwen-7B")
LENGTH = 2048 + 20480  # Table 4: prompt and response


def test_the_r1_distill_shape_has_its_attention_heads() -> None:
    # Qwen2's config.json leaves head_dim out: 3584 / 28 heads.
    assert (R1_7B.layers, R1_7B.kv_heads, R1_7B.head_dim) == (28, 4, 128)
    assert kv_token_bytes(R1_7B, 2) == 2 * 28 * 4 * 128 * 2 == 57_344  # 56 KiB a token
    assert kv_token_bytes(ModelShape(parameters=7 * 10**9), 2) is None  # size from a name


def test_a_colocated_vllm_at_0_3_holds_a_handful_of_eapo_sequences() -> None:
    vllm = estimate_vllm(R1_7B, 0.3, 79.2)
    weights = R1_7B.parameters * 2 / GIB
    activations = 4096 * (3 * 18944 + 4 * 3584) * 2 / GIB
    assert vllm.weights == pytest.approx(weights) and weights == pytest.approx(14.18, abs=0.01)
    kv = 0.3 * 79.2 - weights - activations - VLLM_FIXED_GIB
    assert vllm.kv_cache == pytest.approx(kv)
    assert vllm.sequences(LENGTH) == pytest.approx(kv * GIB / (LENGTH * 57_344))
    assert 5 < vllm.sequences(LENGTH) < 8  # the "about five"
    assert 15 < estimate_vllm(R1_7B, 0.45, 79.2).sequences(LENGTH) < 18
    # A share below the weights leaves no KV cache at all: vLLM would not start.
    assert estimate_vllm(R1_7B, 0.15, 79.2).sequences(LENGTH) == 0


def test_the_room_training_leaves_is_rounded_down_to_a_twentieth() -> None:
    assert room_for_vllm(26.3, 79.2) == 0.65  # (79.2 − 26.3) / 79.2 = 0.668
    assert room_for_vllm(40.4, 79.2) == 0.45  # 0.490
    assert room_for_vllm(100.0, 79.2) == 0.0


def _training(zero_stage: int, world: int = 8):
    return estimate_memory(
        R1_7B,
        micro_batch=1,
        sequence=LENGTH,
        checkpointing=True,
        world_size=world,
        zero_stage=zero_stage,
        vllm_fraction=0.45,
    )


def test_the_periodic_evaluation_under_zero3_gathers_the_policy() -> None:
    memory = _training(zero_stage=3)
    estimate = estimate_eval(
        R1_7B, memory, rows=16, length=LENGTH, zero_stage=3, bf16=True, vllm=0.45 * 79.2
    )
    assert estimate is not None
    # What stays: the shards of weights, gradients and AdamW (16 B a parameter over 8).
    assert estimate.state == pytest.approx(R1_7B.parameters * 16 / 8 / GIB)
    assert estimate.gathered == pytest.approx(R1_7B.parameters * 2 / GIB)  # bf16, whole
    assert estimate.row == pytest.approx(LENGTH * 57_344 / GIB)
    total = estimate.state + estimate.gathered + 16 * estimate.row + 0.45 * 79.2
    assert estimate.total == pytest.approx(total) and total > 79.2
    room = 79.2 - estimate.state - estimate.gathered - 0.45 * 79.2
    assert estimate.rows_that_fit(79.2) == int(room // estimate.row) == 12


def test_without_zero3_the_evaluation_generates_on_the_fp32_model_it_holds() -> None:
    memory = _training(zero_stage=0, world=1)
    estimate = estimate_eval(
        R1_7B, memory, rows=1, length=LENGTH, zero_stage=0, bf16=True, vllm=0.0
    )
    assert estimate is not None and estimate.gathered == 0.0
    # fp32 weights and AdamW, the gradients freed after the step; an fp32 KV cache.
    assert estimate.state == pytest.approx(R1_7B.parameters * 12 / GIB)
    assert estimate.row == pytest.approx(LENGTH * 2 * 57_344 / GIB)


@pytest.mark.parametrize(
    ("zero_stage", "only_model", "per_parameter"),
    [(3, False, 14), (2, False, 16), (0, False, 12), (3, True, 2), (0, True, 4)],
)
def test_a_checkpoint_holds_what_resume_reads(zero_stage, only_model, per_parameter) -> None:
    size = checkpoint_size(zero_stage=zero_stage, bf16=True, lora=False, only_model=only_model)
    assert size.per_parameter == per_parameter
    assert ("save_only_model" in size.holds) == only_model


def test_a_zero3_checkpoint_of_the_7b_policy_is_about_106_gb() -> None:
    size = checkpoint_size(zero_stage=3, bf16=True, lora=False, only_model=False)
    assert R1_7B.parameters * size.per_parameter / GB == pytest.approx(106.6, abs=0.1)
    assert checkpoint_size(zero_stage=3, bf16=True, lora=True, only_model=False).per_parameter == 0
