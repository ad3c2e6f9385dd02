"""Differences between the transformers releases collabrl runs on."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from collabrl.errors import UserError

# transformers 5.20 renamed the checkpointing arguments; the old names are deprecated
# aliases there, and vLLM's CPU build pins a transformers older than that.
CHECKPOINTING_NAMES = {
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}


@cache
def _training_argument_names() -> frozenset[str]:
    from transformers import TrainingArguments

    return frozenset(f.name for f in dataclasses.fields(TrainingArguments))


def _installed_name(new: str) -> str:
    """`new`, or its pre-5.20 name where this transformers does not know it yet."""
    if new in _training_argument_names():
        return new
    return next(old for old, renamed in CHECKPOINTING_NAMES.items() if renamed == new)


def checkpointing_args(trl: dict[str, Any], default: bool) -> dict[str, Any]:
    """`trl` with its checkpointing switch and kwargs under the installed names, and the
    switch set (to `default` where the block gives neither name).

    A block may use either name. Passing the other name beside it would not work: from
    5.20 an explicit `activation_checkpointing` wins over `gradient_checkpointing`, so a
    `gradient_checkpointing: true` next to our own `False` would be silently ignored.
    """
    out = {key: value for key, value in trl.items() if not _is_checkpointing_key(key)}
    for old, new in CHECKPOINTING_NAMES.items():
        value = _one_value(trl, old, new)
        if value is not None:
            out[_installed_name(new)] = value
    switch = _installed_name("activation_checkpointing")
    out.setdefault(switch, default)
    return out


def _is_checkpointing_key(key: str) -> bool:
    return key in CHECKPOINTING_NAMES or key in CHECKPOINTING_NAMES.values()


def _one_value(trl: dict[str, Any], old: str, new: str) -> Any:
    """The value given under either name; both names with different values are refused."""
    if old in trl and new in trl and trl[old] != trl[new]:
        raise UserError(
            f"trl.{old} ({trl[old]}) and trl.{new} ({trl[new]}) disagree",
            f"set only trl.{new} ({old} is its old name)",
        )
    return trl.get(new, trl.get(old))
