"""`is/sequence_mask_drop`: the share of sequences TRL's sequence-level importance mask
would drop, computed as TRL computes the sequence ratio, and logged per scored batch."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from collabrl.config import DecodingConfig
from collabrl.train.importance import (
    SEQUENCE_MASK_DROP,
    sequence_mask_drops,
    watch_sequence_mask,
)
from collabrl.train.resolve import resolve_run


def _rows(*diffs: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Trained and sampling log-probs whose per-token differences are `diffs`."""
    width = max(len(d) for d in diffs)
    trained = torch.zeros(len(diffs), width)
    for i, d in enumerate(diffs):
        trained[i, : len(d)] = torch.tensor(d)
    return trained, torch.zeros(len(diffs), width)


def test_a_sequence_is_dropped_when_its_summed_log_ratio_leaves_the_bounds() -> None:
    # Row sums 2.0 (ratio 7.4 > 3), 1.0 (2.7, kept), -2.0 (0.14: kept without a lower bound).
    trained, sampling = _rows([1.0, 1.0], [0.5, 0.5], [-1.0, -1.0])
    mask = torch.ones_like(trained)
    assert sequence_mask_drops(trained, sampling, mask, None, 3.0) == (1, 3)
    assert sequence_mask_drops(trained, sampling, mask, 0.5, 3.0) == (2, 3)
    assert sequence_mask_drops(trained, sampling, mask, None, None) == (0, 3)


def test_tokens_the_policy_did_not_write_and_unscored_tokens_add_nothing() -> None:
    # A teacher's token (mask 0) disagrees wildly; a NaN sampling log-prob (vLLM had none).
    trained, sampling = _rows([0.1, 50.0, 0.1])
    sampling[0, 2] = math.nan
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    assert sequence_mask_drops(trained, sampling, mask, None, 3.0) == (0, 1)


def test_small_token_differences_drop_a_long_episode_but_not_a_short_one() -> None:
    # 1e-4 nats per token: nothing at 500 tokens, ratio e^2 ≈ 7.4 at 20k tokens.
    trained, sampling = _rows([1e-4] * 500, [1e-4] * 20_000)
    mask = (trained != 0).float()
    assert sequence_mask_drops(trained, sampling, mask, None, 3.0) == (1, 2)


def test_a_huge_log_ratio_does_not_overflow() -> None:
    trained, sampling = _rows([400.0, 400.0], [-400.0, -400.0])
    mask = torch.ones_like(trained)
    assert sequence_mask_drops(trained, sampling, mask, 0.5, 3.0) == (2, 2)


def _trainer(batch: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(
        args=SimpleNamespace(
            vllm_importance_sampling_clip_min=None, vllm_importance_sampling_clip_max=3.0
        ),
        accelerator=SimpleNamespace(gather=lambda t: t),  # one process
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _generate_and_score_completions=lambda inputs: batch,
    )


def test_the_watched_trainer_logs_the_drop_share_of_every_scored_batch() -> None:
    trained, sampling = _rows([1.0, 1.0], [0.1, 0.1], [0.0, 0.0], [5.0, 0.0])
    batch = {
        "old_per_token_logps": trained,
        "sampling_per_token_logps": sampling,
        "completion_mask": torch.ones_like(trained, dtype=torch.long),
        "tool_mask": torch.tensor([[1, 1], [1, 1], [1, 1], [0, 1]]),  # env_mask
    }
    trainer = _trainer(batch)
    watch_sequence_mask(trainer)
    assert trainer._generate_and_score_completions(["p"]) is batch
    assert trainer._metrics["train"][SEQUENCE_MASK_DROP] == [pytest.approx(0.25)]


def test_batches_without_sampling_log_probs_are_not_logged() -> None:
    trained, _ = _rows([1.0])
    trainer = _trainer({"old_per_token_logps": trained, "completion_mask": trained})
    watch_sequence_mask(trainer)
    trainer._generate_and_score_completions(["p"])
    assert SEQUENCE_MASK_DROP not in trainer._metrics["train"]


def test_a_real_trainer_logs_it_when_a_generation_serves_several_updates(
    tiny_model_dir, tmp_path
) -> None:
    """Two optimizer steps from one generation: TRL keeps the sampling-time log-probs
    (`old_per_token_logps`) beside the rollout's, and the metric reaches the log of the
    step that generated (like the reward, once per generation)."""
    from collabrl.data.benchmarks import load_benchmark
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.trainer import build_trainer

    trl = {"per_device_train_batch_size": 2, "steps_per_generation": 2}
    config = GRPOTrainConfig(
        model=str(tiny_model_dir),
        steps=2,
        prompts_per_step=1,
        sampling=DecodingConfig(n=2, max_tokens=8, temperature=1.0),
        save_steps=10,
        trl=trl,
    )
    bench = load_benchmark("arith_train", limit=4)
    trainer, protocol = build_trainer(
        resolve_run(config), bench, tmp_path, None
    )  # it watches the mask
    try:
        trainer.train()
    finally:
        protocol.close()
    logged = [h for h in trainer.state.log_history if SEQUENCE_MASK_DROP in h]
    assert [h["step"] for h in logged] == [1]
    # The same weights sampled and scored the episodes: nothing near the bounds.
    assert logged[0][SEQUENCE_MASK_DROP] == 0.0
