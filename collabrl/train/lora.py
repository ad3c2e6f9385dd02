"""LoRA for every trainer: the `lora:` section of a run's config and peft's config of it.

The papers fine-tune all weights; LoRA is what a user with less memory reaches for. The
adapter trains on the live model, the rollouts generate through it, and `final/` holds
the adapter merged into the base weights (any engine loads that) or, with `merge:
false`, the adapter alone (a LoRA folder: `--model RUN/final` resolves its base).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collabrl.config import option
from collabrl.errors import require


@dataclass
class LoraSettings:
    """Whether a run trains a LoRA adapter, and its shape (peft's usual choices)."""

    enabled: bool = option(False, "Train a LoRA adapter instead of all weights (--lora).")
    r: int = option(16, "LoRA rank.")
    alpha: float = option(32.0, "LoRA scaling alpha (the update is scaled by alpha/r).")
    dropout: float = option(0.05, "Dropout on the LoRA branch.")
    target_modules: list[str] = option(
        ["all-linear"], "Modules LoRA adapts: names (q_proj, v_proj, ...) or all-linear."
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
            target_modules="all-linear" if targets == ["all-linear"] else targets,
            task_type="CAUSAL_LM",
        )


# The flat LoRA keys of `collab train sft` in 0.1 (config.py, RENAMED); `lora` first: the
# switch became the section the others move into.
RENAMED_LORA_KEYS = {
    "lora": "lora.enabled",
    "lora_r": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "lora_target_modules": "lora.target_modules",
}
