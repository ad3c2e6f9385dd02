"""EAPO's training schedules: the acceptance probability ρ_s and the shrinking turn budget.

EAPO (§2.3) closes the expert channel gradually so that the policy internalises what the
experts taught it: an expert answer that came back enters the history with probability
ρ_s = 1/s at global training step s, and "the episode turn budget is reduced from its
initial value toward the evaluation budget". The paper gives neither the turn budget's
values nor the shape of its schedule; here it shrinks linearly (see `turn_budget`).

The paper's training step samples one batch and learns from it, so s counts rollout
*generations*, not optimizer steps: a run that trains each generation in several
optimizer steps (TRL's `steps_per_generation` above `gradient_accumulation_steps`, as
the shipped EAPO config does, 3 updates a generation) still sees ρ = 1, 1/2, 1/3, not
1, 1/4, 1/7. Horizons are given in optimizer steps (the unit of --steps) and cover the
generations those steps train on (`Clock.generations_in`; the section and its clock are
`schedule_config.py`).

`accept_prob` and `turn_budget` are pure functions of the 1-based generation, so a
schedule can be read, plotted and tested without a trainer. `ScheduleCallback` is the one
place they meet TRL: when the rollout generates (`on_generation`, called by
`train/rollout.py`), it writes both values into the protocol's config, which the consult
protocol reads on every `run`. A trainer whose protocol has no schedule (relay, solo) is
simply not given the callback.

`pin_horizons` fixes every "0: the whole run" step count of a training run — these two
windows and rSIM's λ switch, each its method's (`MethodSpec.pin_horizons`) — to a number
when the run starts, so that the config saved in the run folder holds it and a resume
with another --steps does not move it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from collabrl.train.methods import registry as methods
from collabrl.train.run import resumed_config
from collabrl.train.schedule_config import Clock, ScheduleConfig

if TYPE_CHECKING:
    from collabrl.train.grpo_config import GRPOTrainConfig


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
    return methods.get(config.method).pin_horizons(config, resumed_config(config, out))


def _check_step(step: int) -> None:
    """s is 1-based, as in ρ_s = 1/s; a 0 would be a 0-based count."""
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
    """ρ at training step `step`, a 1-based generation (ρ_1 = 1 under inverse and linear);
    the horizons of `config` count generations too (`for_run`)."""
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
    """The turn budget at training step `step` (a 1-based generation): linear from start
    (step 1) to end (step anneal_steps and after), rounded to the nearest integer,
    halves towards end.

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
    """Sets ρ and the turn budget of `target.config` when the rollout generates.

    The rollout calls `on_generation` before it runs the protocol (TRL calls no callback
    there): the values are those of that generation, s = generations so far + 1, with
    "0: the whole run" horizons read from the trainer's `state.max_steps`.
    """

    def __init__(self, config: ScheduleConfig, target: Scheduled) -> None:
        config.check()
        self.config = config
        self.target = target

    def on_generation(self, args: Any, state: TrainerState, micro_step: int) -> None:
        """Before a rollout: `micro_step` is the trainer's count of micro-batches trained
        in this process (TRL's `_step`), `args` its GRPOConfig."""
        clock = Clock.of(args)
        generation = clock.generation(state.global_step, micro_step)
        schedule = self.config.for_run(state.max_steps, clock)
        self.target.config.accept_prob = accept_prob(generation, schedule)
        self.target.config.turn_budget = turn_budget(generation, schedule)

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
