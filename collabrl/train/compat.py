"""Differences between the transformers releases collabrl runs on."""

from __future__ import annotations

import dataclasses
from functools import cache


@cache
def _training_argument_names() -> frozenset[str]:
    from transformers import TrainingArguments

    return frozenset(f.name for f in dataclasses.fields(TrainingArguments))


def checkpointing(enabled: bool) -> dict[str, bool]:
    """The trainer argument that turns activation checkpointing on or off: transformers
    renamed `gradient_checkpointing` to `activation_checkpointing` (5.20; the old name is
    deprecated there), and vLLM's CPU build pins a transformers older than that."""
    if "activation_checkpointing" in _training_argument_names():
        return {"activation_checkpointing": enabled}
    return {"gradient_checkpointing": enabled}
