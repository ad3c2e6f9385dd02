"""How far the rollout sampler and the trained model disagree, per sequence.

With `trl.use_vllm` the episodes are sampled by vLLM and trained with the trainer's
own forward pass; TRL corrects the mismatch by importance sampling, per token or per
sequence (`vllm_importance_sampling_mode`). A sequence-level ratio is the product of
the token ratios, so over the 8k–20k policy tokens of a multi-author episode small
per-token differences add up and a sequence-level mask (TRL's default) throws whole
episodes away. `collab train` uses the per-token truncated mode instead
(`grpo.IS_DEFAULTS`), and logs `is/sequence_mask_drop`: the share of a step's
sequences that the sequence mask, with the run's bounds, would have dropped. It
measures what the choice saves, and shows when the sampler drifts from the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

SEQUENCE_MASK_DROP = "is/sequence_mask_drop"


def sequence_mask_drops(
    trained_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    clip_min: float | None,
    clip_max: float | None,
) -> tuple[int, int]:
    """(dropped, sequences): how many rows of a (sequences × tokens) batch TRL's
    `sequence_mask` mode would zero, out of how many.

    The sequence ratio is exp(Σ_t mask_t · (trained_t − sampling_t)), as TRL computes it:
    tokens the policy did not write (mask 0: teacher, expert, environment text, padding)
    and tokens without a sampling log-prob (NaN) add nothing. A ratio outside
    [clip_min, clip_max] is dropped; a bound of None is open.
    """
    import torch

    diff = torch.nan_to_num((trained_logps - sampling_logps) * mask, nan=0.0)
    log_ratio = diff.sum(dim=-1)
    low = math.log(clip_min) if clip_min is not None and clip_min > 0 else -math.inf
    high = math.inf if clip_max is None else math.log(clip_max)
    # Compared in log space: exp of a 20k-token sum overflows to inf or underflows to 0.
    dropped = (log_ratio < low) | (log_ratio > high)
    return int(dropped.sum().item()), int(log_ratio.numel())


def log_sequence_mask_drop(trainer: Any, batch: dict[str, Any]) -> None:
    """Add `is/sequence_mask_drop` for a scored generation batch to the trainer's metrics,
    over every process's sequences. Batches without both log-prob sets (no vLLM, or no
    importance sampling) are skipped."""
    trained, sampling = batch.get("old_per_token_logps"), batch.get("sampling_per_token_logps")
    if trained is None or sampling is None:
        return
    import torch

    mask = batch["completion_mask"]
    if batch.get("tool_mask") is not None:
        mask = mask * batch["tool_mask"]
    args = trainer.args
    counts = sequence_mask_drops(
        trained,
        sampling,
        mask,
        args.vllm_importance_sampling_clip_min,
        args.vllm_importance_sampling_clip_max,
    )
    local = torch.tensor(counts, dtype=torch.float32, device=trained.device)
    dropped, total = trainer.accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
    mode = "train" if trainer.model.training else "eval"
    trainer._metrics[mode][SEQUENCE_MASK_DROP].append(dropped / total if total else 0.0)


def watch_sequence_mask(trainer: Any) -> None:
    """Log `is/sequence_mask_drop` after every generation batch `trainer` scores.

    TRL has no hook between scoring a batch and training on it, and the log-probs live
    only in what `_generate_and_score_completions` returns; wrapping that one method on
    the instance serves TRL's `GRPOTrainer` and its subclasses (`RSIMTrainer`) alike.
    """
    score: Callable[[Any], dict[str, Any]] = trainer._generate_and_score_completions

    def scored(inputs: Any) -> dict[str, Any]:
        batch = score(inputs)
        log_sequence_mask_drop(trainer, batch)
        return batch

    trainer._generate_and_score_completions = scored
