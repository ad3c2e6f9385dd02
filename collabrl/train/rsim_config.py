"""The `rsim:` section of `collab train rsim`: who learns, and the λ schedule (rSIM §4).

Config only, as TRL's own config modules are: `train/rsim.py` reads it (the λ schedule,
the planner's loss), `train/rsim_trainer.py` puts that into TRL's GRPOTrainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from collabrl.config import option
from collabrl.errors import UserError, require

TRAIN_MODES = ("joint", "planner", "reasoner")


@dataclass
class RSIMConfig:
    """Who learns in an rSIM run, and how the two losses are weighed."""

    train: str = option(
        "joint",
        "joint: planner and reasoner together (leader-follower, §4); planner: the reasoner "
        "frozen (a plug-in planner for it); reasoner: the planner frozen.",
    )
    lambda_first: float = option(
        0.7,
        "λ for steps 1..lambda_switch_step (§4: 0.7, the planner first). λ scales the "
        "learning rates: the planner's by λ, the reasoner's by 1 − λ (under AdamW a loss "
        "weight would cancel out).",
    )
    lambda_after: float = option(
        0.3,
        "λ after lambda_switch_step (§4: 0.3, the reasoner's turn): planner rate × λ, "
        "reasoner rate × (1 − λ).",
    )
    lambda_switch_step: int = option(
        0,
        "N, the last step of the first stage; 0: half the run (the paper gives no N), "
        "written into the run's config.yaml as a number when it starts, so a resume with "
        "another --steps keeps it.",
    )
    planner_learning_rate: float | None = option(
        None,
        "AdamW learning rate of the planner before λ scales it (default: learning_rate, as in §5).",
    )
    planner_chunk: int = option(
        16,
        "Planner decisions per forward and backward pass of its loss; a micro-batch holds "
        "up to per_device_train_batch_size × strategy.max_steps of them (16 × 12 at paper "
        "scale), and the planner's activations peak at one chunk's. Gradients accumulate "
        "over the chunks, so the update does not depend on it.",
    )

    def check(self) -> None:
        if self.train not in TRAIN_MODES:
            raise UserError(f"unknown rsim.train '{self.train}'", f"use {', '.join(TRAIN_MODES)}")
        for key in ("lambda_first", "lambda_after"):
            value = getattr(self, key)
            require(f"rsim.{key}", value, 0.0 <= value <= 1.0, "in [0, 1]")
        step = self.lambda_switch_step
        require("rsim.lambda_switch_step", step, step >= 0, ">= 0 (0: half the run)")
        lr = self.planner_learning_rate
        require("rsim.planner_learning_rate", lr, lr is None or lr > 0, "> 0")
        chunk = self.planner_chunk
        require("rsim.planner_chunk", chunk, chunk >= 1, ">= 1")


def default_switch_step(max_steps: int) -> int:
    """N when lambda_switch_step is 0: half the run, rounded up."""
    return math.ceil(max_steps / 2)
