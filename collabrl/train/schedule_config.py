"""The `schedule:` section of `collab train eapo`: how EAPO's acceptance probability ρ_s and
turn budget change over a run (EAPO §2.3), and the clock that counts its steps.

Config only, as TRL's own config modules are: `train/schedules.py` holds the schedules
themselves (`accept_prob`, `turn_budget`) and the callback that applies them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from collabrl.config import option
from collabrl.errors import UserError, require

ACCEPT_SCHEDULES = ("inverse", "constant", "linear", "off")


@dataclass
class ScheduleConfig:
    """How ρ (expert answers accepted) and the turn budget change over a training run."""

    accept: str = option(
        "inverse",
        "rho_s at training step s, counted in rollout generations from 1 (EAPO's step "
        "samples a batch, then learns from it): inverse: 1/s (EAPO §2); constant: "
        "accept_value; linear: from 1 at the first generation to accept_end at the last of "
        "accept_steps, then held; off: 0, every returned expert answer reads unavailable.",
    )
    accept_value: float = option(1.0, "rho for accept=constant, in [0, 1].")
    accept_end: float = option(0.0, "rho reached by accept=linear at step accept_steps, in [0, 1].")
    accept_steps: int = option(
        0,
        "Optimizer steps over which accept=linear goes from 1 to accept_end (the "
        "generations they train on); 0: the whole run, "
        "written into the run's config.yaml as a number when it starts (a resume with "
        "another --steps keeps it).",
    )
    turn_budget_start: int = option(
        6,
        "Policy turns per episode at the first generation (the training value; the paper "
        "gives none, "
        "this is consult.turn_budget's default).",
    )
    turn_budget_end: int = option(
        1,
        "Policy turns per episode from the end of anneal_steps on: the evaluation value "
        "(consult's locked mode is one turn). Equal to turn_budget_start: no annealing.",
    )
    anneal_steps: int = option(
        0,
        "Optimizer steps over which the turn budget shrinks from start to end (the "
        "generations they train on); 0: the whole run, "
        "written into the run's config.yaml as a number when it starts (a resume with "
        "another --steps keeps it).",
    )

    def check(self) -> None:
        """Refuse schedules no run can follow, before any model is loaded."""
        if self.accept not in ACCEPT_SCHEDULES:
            raise UserError(
                f"unknown accept schedule '{self.accept}'", f"use {', '.join(ACCEPT_SCHEDULES)}"
            )
        # NaN fails every comparison, so these also refuse `nan`.
        for key in ("accept_value", "accept_end"):
            value = getattr(self, key)
            require(f"schedule.{key}", value, 0.0 <= value <= 1.0, "in [0, 1]")
        for key in ("accept_steps", "anneal_steps"):
            value = getattr(self, key)
            require(f"schedule.{key}", value, value >= 0, ">= 0 (0: the whole run)")
        end, start = self.turn_budget_end, self.turn_budget_start
        require("schedule.turn_budget_end", end, end >= 1, ">= 1")
        require(
            "schedule.turn_budget_start",
            start,
            start >= end,
            f">= schedule.turn_budget_end ({end}): the budget only shrinks",
        )

    def for_run(self, max_steps: int, clock: Clock | None = None) -> ScheduleConfig:
        """A copy whose 0 ("the whole run") step counts read `max_steps`, and whose
        horizons count the generations of `clock` (optimizer steps when it is None)."""
        clock = clock or Clock()
        return replace(
            self,
            accept_steps=clock.generations_in(self.accept_steps or max_steps),
            anneal_steps=clock.generations_in(self.anneal_steps or max_steps),
        )


@dataclass(frozen=True)
class Clock:
    """How a trainer's micro-batches group into optimizer steps and rollout generations:
    TRL's `gradient_accumulation_steps`, and `steps_per_generation` × `num_iterations`
    (the micro-batches trained on one generation's completions)."""

    accumulation: int = 1
    per_generation: int = 1

    @classmethod
    def of(cls, args: Any) -> Clock:
        """The clock of TRL's GRPOConfig (`steps_per_generation` defaults to accumulation)."""
        accumulation = args.gradient_accumulation_steps
        per_generation = getattr(args, "steps_per_generation", None) or accumulation
        return cls(accumulation, per_generation * getattr(args, "num_iterations", 1))

    def generation(self, global_step: int, micro_step: int) -> int:
        """The 1-based number of the generation that starts at this micro-batch:
        `global_step` optimizer steps done, `micro_step` micro-batches into the next.

        A resumed run (TRL restarts its micro-batch count, and generates on its first
        batch) counts on: resumed between two generations, its first one is the next."""
        done = global_step * self.accumulation + micro_step % self.accumulation
        return -(-done // self.per_generation) + 1

    def generations_in(self, steps: int) -> int:
        """The generations that `steps` optimizer steps train on (a part one counts)."""
        return -(-steps * self.accumulation // self.per_generation)
