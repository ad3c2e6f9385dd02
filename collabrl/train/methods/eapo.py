"""`collab train eapo`: EAPO §2, GRPO on consult episodes with an expert pool: the F1
reward (less a penalty per expert call), the ρ_s acceptance and turn-budget schedules
over the run (`train/schedules.py`), DAPO's asymmetric clip. The rollouts consult with
the expert channel open; the held-out evaluation locks it, as the paper evaluates."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from collabrl.train.methods.spec import MethodSpec

if TYPE_CHECKING:
    from pathlib import Path

    from collabrl.protocols.base import CollabProtocol
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.plan_rows import TrainPlan
    from collabrl.train.schedule_config import ScheduleConfig

# EAPO trains with DAPO's decoupled clip (ε_low 0.2, ε_high 0.28).
DAPO_CLIP = {"epsilon": 0.2, "epsilon_high": 0.28}


def rollout(protocol: ProtocolConfig) -> ProtocolConfig:
    """Training consults: the expert channel open, whatever the config's mode."""
    return dataclasses.replace(protocol, consult=dataclasses.replace(protocol.consult, mode="open"))


def held_out(protocol: ProtocolConfig, run: Path | None) -> ProtocolConfig:
    """EAPO evaluates the policy alone: the expert channel locked."""
    return dataclasses.replace(
        protocol, consult=dataclasses.replace(protocol.consult, mode="locked")
    )


def check(config: GRPOTrainConfig, protocol: ProtocolConfig) -> None:
    """Asking every expert must not end the episode unanswered."""
    from collabrl.protocols.consult_config import check_turn_fits

    check_turn_fits(protocol.consult, config.sampling.max_tokens)


def rewards(config: GRPOTrainConfig) -> list[Any]:
    from collabrl.train.rewards import eapo

    reward = functools.partial(eapo, penalty=config.consult_penalty)
    return [functools.update_wrapper(reward, eapo)]  # TRL logs a reward under its __name__


def pin_horizons(config: GRPOTrainConfig, before: GRPOTrainConfig | None) -> GRPOTrainConfig:
    """The schedules' "0: the whole run" horizons: the saved run's, else --steps."""
    schedule = config.schedule
    accept = before.schedule.accept_steps if before else config.steps
    anneal = before.schedule.anneal_steps if before else config.steps
    pinned = dataclasses.replace(
        schedule,
        accept_steps=schedule.accept_steps or accept,
        anneal_steps=schedule.anneal_steps or anneal,
    )
    return dataclasses.replace(config, schedule=pinned)


def callbacks(config: GRPOTrainConfig, protocol: CollabProtocol) -> list[Any]:
    """The schedules, which also put accept_prob and turn_budget into the logs."""
    from collabrl.train.schedules import ScheduleCallback

    return [ScheduleCallback(config.schedule, protocol)]  # type: ignore[arg-type]


def plan_rows(plan: TrainPlan, config: GRPOTrainConfig, args: Any, steps: int | None) -> None:
    """EAPO's panel, its consultation penalty, and the ρ_s and turn-budget schedules as
    the run will follow them: over the rollout generations of `steps` optimizer steps."""
    from collabrl.train.schedule_config import Clock

    accumulation = args.gradient_accumulation_steps
    updates = (args.steps_per_generation or accumulation) // accumulation
    if updates * args.num_iterations == 1:
        plan.warnings.append(
            "one optimizer update per rollout: the PPO ratio is always 1 and DAPO's clip "
            "never acts (set trl.steps_per_generation above trl.gradient_accumulation_steps)"
        )
    section = "eapo (experts and schedules)"
    consult = config.protocol.consult
    plan.add(
        section,
        "experts",
        f"K = {consult.num_experts} (up to K queries a turn, {consult.query_budget} an "
        f"episode), answers up to {consult.expert_max_tokens} tokens at temperature "
        f"{consult.expert_temperature}, top-p {consult.expert_top_p}",
    )
    plan.add(section, "consultation penalty", f"{config.consult_penalty} per expert query")
    if steps is None:
        when = "over the run's generations (counted when it starts)"
        plan.add(section, "ρ_s (answers accepted)", f"{config.schedule.accept}, {when}")
        budget = config.schedule
        plan.add(
            section, "turn budget", f"{budget.turn_budget_start} → {budget.turn_budget_end}, {when}"
        )
        return
    clock = Clock.of(args)
    schedule = config.schedule.for_run(steps, clock)
    generations = clock.generations_in(steps)
    plan.add(section, "rollout generations", f"{generations} over {steps} optimizer steps")
    plan.add(section, "ρ_s (answers accepted)", accept_schedule(schedule, generations))
    plan.add(section, "turn budget", turn_schedule(schedule, generations))


def accept_schedule(schedule: ScheduleConfig, generations: int) -> str:
    """ρ_s at the first generations and the last."""
    from collabrl.train.schedules import accept_prob

    shown = sorted({s for s in (1, 2, 10, generations) if s <= generations})
    values = ", ".join(f"{accept_prob(s, schedule):.3g} at {s}" for s in shown)
    rule = {
        "inverse": "1/s (EAPO §2)",
        "constant": f"constant {schedule.accept_value}",
        "linear": f"1 → {schedule.accept_end} over generations 1–{schedule.accept_steps}",
        "off": "off (0)",
    }[schedule.accept]
    return f"{rule}: {values} (generation s)"


def turn_schedule(schedule: ScheduleConfig, generations: int) -> str:
    """The turn budget, from the generation each value starts at."""
    from bisect import bisect_left

    from collabrl.train.schedules import turn_budget

    def falling(s: int) -> int:  # the budget never rises: minus it is sorted
        return -turn_budget(s, schedule)

    starts: list[str] = []
    for value in range(schedule.turn_budget_start, schedule.turn_budget_end - 1, -1):
        # The first generation whose budget is `value` or less (a run of millions of
        # generations is searched, not walked).
        s = bisect_left(range(1, generations + 1), -value, key=falling) + 1
        if s <= generations and turn_budget(s, schedule) == value:
            starts.append(f"{value} from {s}")
    steps = ", ".join(starts)
    return f"{steps} (generation; linear over {schedule.anneal_steps})"


SPEC: MethodSpec[GRPOTrainConfig] = MethodSpec(
    name="eapo",
    help="EAPO §2: GRPO on consult episodes with an expert pool (--expert), F1 reward, "
    "ρ_s = 1/s acceptance and an annealed turn budget.",
    protocol="consult",
    fields=("consult_penalty", "schedule"),
    card="EAPO: GRPO with the consult protocol, asking an expert pool",
    tags=("grpo", "eapo"),
    trl=DAPO_CLIP,
    rollout=rollout,
    check=check,
    held_out=held_out,
    rewards=rewards,
    pin_horizons=pin_horizons,
    callbacks=callbacks,
    plan_rows=plan_rows,
)
