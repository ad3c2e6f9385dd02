"""Rewards for `collab train … --reward-func scripts/evidence/rewards.py:NAME`, added to
the method's own (TRL's signature; the episodes' extras arrive as keyword lists)."""

from __future__ import annotations

from typing import Any

# What one call to the teacher costs, in units of a correct answer (RelayLLM's 1(a = g)).
CALL_COST = 0.1


def call_cost(prompts: list[Any], completions: list[Any], **extras: Any) -> list[float]:
    """−CALL_COST per call an episode made: a teacher is not free, whatever it writes."""
    return [-CALL_COST * calls for calls in extras["calls"]]
