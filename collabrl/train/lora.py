"""LoRA for every trainer: the `lora:` section of a run's config and peft's config of it.

The papers fine-tune all weights; LoRA is what a user with less memory reaches for. The
adapter trains on the live model, the rollouts generate through it, and `final/` holds
the adapter merged into the base weights (any engine loads that) or, with `merge:
false`, the adapter alone (a LoRA folder: `--model RUN/final` resolves its base).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collabrl.config import option
from collabrl.errors import UserError, require

ALL_LINEAR = "all-linear"  # peft's shorthand: every linear layer but the output head


@dataclass
class LoraSettings:
    """Whether a run trains a LoRA adapter, and its shape (peft's usual choices)."""

    enabled: bool = option(False, "Train a LoRA adapter instead of all weights (--lora).")
    r: int = option(16, "LoRA rank.")
    alpha: float = option(32.0, "LoRA scaling alpha (the update is scaled by alpha/r).")
    dropout: float = option(0.05, "Dropout on the LoRA branch.")
    target_modules: list[str] = option(
        [ALL_LINEAR], "Modules LoRA adapts: names (q_proj, v_proj, ...) or all-linear alone."
    )
    merge: bool = option(
        True, "final/ holds the adapter merged into the base weights; false: the adapter alone."
    )

    def check(self) -> None:
        require("lora.r", self.r, 1 <= self.r <= 4096, "in [1, 4096]")
        require("lora.alpha", self.alpha, 0 < self.alpha < float("inf"), "a finite number > 0")
        require("lora.dropout", self.dropout, 0 <= self.dropout < 1, "in [0, 1)")
        modules = self.target_modules
        require("lora.target_modules", modules, bool(modules), "at least one module name")
        # peft reads all-linear only alone, as a string: in a list it is one more name,
        # matched by no module, and [all-linear, q_proj] adapts q_proj alone.
        alone = ALL_LINEAR not in modules or modules == [ALL_LINEAR]
        require("lora.target_modules", modules, alone, f"{ALL_LINEAR} alone, or module names")

    def check_targets(self, model: str) -> None:
        """Refuse a target module `model` does not have (peft would raise from inside the
        trainer, after the run folder is written, or skip it silently beside one it
        has), read from its config.json before any weight loads. A model not on this
        machine is left to the run (a dry run may plan for a cluster's folder)."""
        from collabrl.models import resolve_model, weights_dir

        if not self.enabled or self.target_modules == [ALL_LINEAR]:
            return
        try:
            folder = weights_dir(resolve_model(model))
        except UserError:
            return
        names = adaptable_modules(folder)
        for target in self.target_modules:
            # peft's rule: a module's full name is the target or ends with ".target".
            if not any(name == target or name.endswith(f".{target}") for name in names):
                kinds = sorted({name.rpartition(".")[2] for name in names})
                raise UserError(
                    f"lora.target_modules: {model} has no module {target!r} LoRA can adapt",
                    f"its adaptable modules are {', '.join(kinds)}; or use {ALL_LINEAR}",
                )

    def peft_config(self) -> Any:
        """peft's LoraConfig, or None when LoRA is off (the trainers' `peft_config`)."""
        if not self.enabled:
            return None
        from peft import LoraConfig

        targets = self.target_modules
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            # peft reads "all-linear" only as a string, not inside a list.
            target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else targets,
            task_type="CAUSAL_LM",
        )


@functools.cache
def adaptable_modules(folder: Path) -> tuple[str, ...]:
    """The full names of the modules of the model in `folder` that LoRA can adapt (the
    linear, embedding and convolution layers peft supports), on torch's meta device."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    from collabrl.models import meta_model

    kinds = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, Conv1D)
    return tuple(n for n, module in meta_model(folder).named_modules() if isinstance(module, kinds))


# The flat LoRA keys of `collab train sft` in 0.1 (config.py, RENAMED); `lora` first: the
# switch became the section the others move into.
RENAMED_LORA_KEYS = {
    "lora": "lora.enabled",
    "lora_r": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "lora_target_modules": "lora.target_modules",
}
