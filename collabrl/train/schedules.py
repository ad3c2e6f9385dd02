"""EAPO's training schedules: the acceptance probability ρ_s and the shrinking turn budget.

EAPO (§2.3) closes the expert channel gradually so that the policy internalises what the
experts taught it: an expert answer that came back enters the history with probability
ρ_s = 1/s at global training step s, and "the episode turn budget is reduced from its
initial value toward the evaluation budget". The paper gives neither the turn budget's
values nor the shape of its schedule; here it shrinks linearly (see `turn_budget`).

`accept_prob` and `turn_budget` are pure functions of the 1-based step, so a schedule can
be read, plotted and tested without a trainer. `ScheduleCallback` is the one place they
meet TRL: before each optimizer step it writes both values into the protocol's config,
which the consult protocol reads on every `run`. A trainer whose protocol has no
schedule (relay, solo) is simply not given the callback.

`pin_horizons` fixes every "0: the whole run" step count of a training run — these two
windows and rSIM's λ switch — to a number when the run starts, so that the config saved
in the run folder holds it and a resume with another --steps does not move it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from collabrl import runs
from collabrl.config import build_config, option, read_yaml
from collabrl.errors import UserError, require
from collabrl.train.rsim import default_switch_step

if TYPE_CHECKING:
    from collabrl.train.grpo_config import GRPOTrainConfig

ACCEPT_SCHEDULES = ("inverse", "constant", "linear", "off")


@dataclass
class ScheduleConfig:
    """How ρ (expert answers accepted) and the turn budget change over a training run."""

    accept: str = option(
        "inverse",
        "rho_s at global step s (1-based): inverse: 1/s (EAPO §2); constant: accept_value; "
        "linear: from 1 at step 1 to accept_end at step accept_steps, then held; "
        "off: 0, every returned expert answer reads unavailable.",
    )
    accept_value: float = option(1.0, "rho for accept=constant, in [0, 1].")
    accept_end: float = option(0.0, "rho reached by accept=linear at step accept_steps, in [0, 1].")
    accept_steps: int = option(
        0,
        "Steps over which accept=linear goes from 1 to accept_end; 0: the whole run, "
        "written into the run's config.yaml as a number when it starts (a resume with "
        "another --steps keeps it).",
    )
    turn_budget_start: int = option(
        6,
        "Policy turns per episode at step 1 (the training value; the paper gives none, "
        "this is consult.turn_budget's default).",
    )
    turn_budget_end: int = option(
        1,
        "Policy turns per episode from step anneal_steps on: the evaluation value "
        "(consult's locked mode is one turn). Equal to turn_budget_start: no annealing.",
    )
    anneal_steps: int = option(
        0,
        "Steps over which the turn budget shrinks from start to end; 0: the whole run, "
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

    def for_run(self, max_steps: int) -> ScheduleConfig:
        """A copy whose 0 ("the whole run") step counts read `max_steps`."""
        return replace(
            self,
            accept_steps=self.accept_steps or max_steps,
            anneal_steps=self.anneal_steps or max_steps,
        )


def pin_horizons(config: GRPOTrainConfig, out: Path) -> GRPOTrainConfig:
    """`config` with its method's "0: the whole run" horizons as numbers: eapo's
    schedule.accept_steps and anneal_steps, rsim's rsim.lambda_switch_step.

    A fresh run reads them off its own --steps (half of it for the λ switch). A resumed
    run takes them from the config saved in `out` when it started, so `--resume --steps
    M` trains further without moving the switch or the schedules (they would otherwise
    follow the new max_steps). A horizon given as a number is kept either way; one that
    differs from the saved run's is then refused by the run folder, like any change. A
    run saved before horizons were pinned keeps its 0s: they still follow --steps.
    """
    saved = out / runs.CONFIG
    if config.resume and saved.is_file():
        before = build_config(type(config), [read_yaml(saved)])
        accept, anneal = before.schedule.accept_steps, before.schedule.anneal_steps
        switch = before.rsim.lambda_switch_step
    else:
        accept = anneal = config.steps
        switch = default_switch_step(config.steps)
    if config.method == "eapo":
        schedule = replace(
            config.schedule,
            accept_steps=config.schedule.accept_steps or accept,
            anneal_steps=config.schedule.anneal_steps or anneal,
        )
        config = replace(config, schedule=schedule)
    if config.method == "rsim":
        rsim = replace(config.rsim, lambda_switch_step=config.rsim.lambda_switch_step or switch)
        config = replace(config, rsim=rsim)
    return config


def _check_step(step: int) -> None:
    """s is 1-based, as in ρ_s = 1/s; a 0 would be the trainer's 0-based global_step."""
    if step < 1:
        raise ValueError(f"training steps count from 1, got {step}")


def _elapsed(step: int, steps: int) -> tuple[int, int]:
    """(steps done since step 1, capped at the window; the window's length in such steps).

    Both schedules run from step 1 to step `steps` and then hold, so step `steps` is the
    last of the window. A window of 0 means the run length was never filled in.
    """
    if steps < 1:
        raise ValueError("the schedule's step count is 0: resolve it with for_run(max_steps)")
    return min(step, steps) - 1, steps - 1


def accept_prob(step: int, config: ScheduleConfig) -> float:
    """ρ at global step `step` (1-based: ρ_1 = 1 under inverse and linear)."""
    _check_step(step)
    if config.accept == "inverse":
        return 1.0 / step
    if config.accept == "constant":
        return config.accept_value
    if config.accept == "off":
        return 0.0
    done, span = _elapsed(step, config.accept_steps)
    progress = done / span if span else 1.0
    # Written as a weighted mean so both endpoints come out exactly: 1 and accept_end.
    return (1.0 - progress) + progress * config.accept_end


def turn_budget(step: int, config: ScheduleConfig) -> int:
    """The turn budget at global step `step`: linear from start (step 1) to end
    (step anneal_steps and after), rounded to the nearest integer, halves towards end.

    Integer arithmetic, so the rounding is exact and the budget never rises.
    """
    _check_step(step)
    done, span = _elapsed(step, config.anneal_steps)
    if span == 0:
        return config.turn_budget_end
    drop = config.turn_budget_start - config.turn_budget_end
    return config.turn_budget_start - (2 * drop * done + span) // (2 * span)


class ScheduledConfig(Protocol):
    """A protocol config the schedules drive (`ConsultConfig`)."""

    accept_prob: float
    turn_budget: int


class Scheduled(Protocol):
    """An object whose config the protocol reads on every run (`ConsultProtocol`)."""

    @property
    def config(self) -> ScheduledConfig: ...


class ScheduleCallback(TrainerCallback):
    """Sets ρ and the turn budget of `target.config` before each training step.

    The trainer's rollouts for step s = state.global_step + 1 are generated after
    `on_step_begin`, so they see that step's values. A run of 0 steps ("the whole run")
    reads the trainer's `state.max_steps`. A trainer that generates several steps'
    rollouts at once (TRL's `steps_per_generation` above `gradient_accumulation_steps`)
    uses the values of the step that generated them.
    """

    def __init__(self, config: ScheduleConfig, target: Scheduled) -> None:
        config.check()
        self.config = config
        self.target = target

    def on_step_begin(
        self,
        args: TrainingArguments | None,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        step = state.global_step + 1
        schedule = self.config.for_run(state.max_steps)
        self.target.config.accept_prob = accept_prob(step, schedule)
        self.target.config.turn_budget = turn_budget(step, schedule)

    def on_log(
        self,
        args: TrainingArguments | None,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Add the values in force to the logs.

        Callbacks share one `logs` dict in list order, and the Trainer copies it into
        `state.log_history` before any callback runs: the keys reach the callbacks after
        this one, so a trainer puts it before its reporting callbacks.
        """
        if logs is not None:
            logs["accept_prob"] = self.target.config.accept_prob
            logs["turn_budget"] = self.target.config.turn_budget
