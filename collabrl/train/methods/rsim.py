"""`collab train rsim`: rSIM §4, a planner trained beside the policy on the strategy
protocol (`train/rsim.py` holds the rules, `train/rsim_trainer.py` the trainer).

What sets it apart from the other GRPO methods is all here: the planner trains in
every process (float32 master weights, under DDP), a resumed run starts from the planner
its checkpoint saved, the run folder keeps the trained planner, the held-out evaluation
plans greedily with the planner that ran beside the policy, and λ acts on the two
learning rates (the dry run shows each stage).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl.train.methods.spec import MethodOption, MethodSpec

if TYPE_CHECKING:
    from collabrl.config import EngineConfig
    from collabrl.protocols.base import CollabProtocol
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.plan_rows import TrainPlan
    from collabrl.train.rsim import AgentRates

# The per-step table of `collab train rsim`, header -> metrics.jsonl key.
COLUMNS = {
    "reward": "reward",
    "accuracy": "episodes/accuracy",
    "follow": "rewards/follow/mean",
    "planner reward": "planner/reward",
    "λ": "planner/lambda",
}
MEMORY = "memory per device (estimate)"  # the dry run's section (train/plan.py)


def check(config: GRPOTrainConfig, protocol: ProtocolConfig) -> None:
    from collabrl.errors import UserError

    kind = config.protocol.strategy.planner_kind
    if kind != "rsim":
        raise UserError(
            f"collab train rsim trains an rsim planner, not {kind}",
            "drop protocol.strategy.planner_kind (it defaults to rsim)",
        )


def held_out(protocol: ProtocolConfig, run: Path | None) -> ProtocolConfig:
    """The planner plans greedily, as the paper evaluates: the starting one for the
    starting policy, the one trained beside it for the trained policy."""
    from collabrl.train.rsim import PLANNER_DIR

    strategy = dataclasses.replace(protocol.strategy, planner_temperature=0.0)
    planner = protocol.planner if run is None else str(run / PLANNER_DIR)
    return dataclasses.replace(protocol, strategy=strategy, planner=planner)


def resumed(protocol: ProtocolConfig, checkpoint: str) -> ProtocolConfig:
    """A resumed run's planner: the one saved with its checkpoint."""
    from collabrl.errors import UserError
    from collabrl.protocols.planner import PLANNER_FILE
    from collabrl.train.rsim import PLANNER_DIR

    folder = Path(checkpoint) / PLANNER_DIR
    if not (folder / PLANNER_FILE).is_file():
        raise UserError(
            f"{checkpoint} holds no planner (the run stopped while saving it)",
            f"delete {checkpoint} and --resume from the checkpoint before it",
        )
    return dataclasses.replace(protocol, planner=str(folder))


def rewards(config: GRPOTrainConfig) -> list[Any]:
    from collabrl.train.rewards import accuracy, follow, step_format

    return [accuracy, step_format, follow]  # rSIM's R = R_acc + R_format + R_follow


def pin_horizons(config: GRPOTrainConfig, before: GRPOTrainConfig | None) -> GRPOTrainConfig:
    """The λ switch of "0: half the run": the saved run's, else half of --steps."""
    from collabrl.train.rsim_config import default_switch_step

    switch = before.rsim.lambda_switch_step if before else default_switch_step(config.steps)
    rsim = dataclasses.replace(
        config.rsim, lambda_switch_step=config.rsim.lambda_switch_step or switch
    )
    return dataclasses.replace(config, rsim=rsim)


def trainer(config: GRPOTrainConfig, protocol: CollabProtocol) -> tuple[type, dict[str, Any]]:
    from collabrl.train.rsim_trainer import RSIMTrainer

    return RSIMTrainer, {"planner": protocol.planner, "rsim": config.rsim}  # type: ignore[attr-defined]


def collaborators_engine(engine: EngineConfig) -> EngineConfig:
    """The planner trains beside the policy, so it keeps float32 master weights as the
    policy does (an optimizer stepping bfloat16 weights loses most small updates)."""
    return dataclasses.replace(engine, dtype="float32")


def finish(trainer: Any, out: Path, history: list[dict[str, Any]], title: str) -> None:
    from collabrl.train.rsim import PLANNER_DIR, STRATEGY_PLOT, plot_strategies

    trainer.save_planner(out / PLANNER_DIR)
    plot_strategies(history, out / STRATEGY_PLOT, title)


def outputs(out: Path) -> dict[str, str]:
    from collabrl.train.rsim import PLANNER_DIR

    return {"planner, trained beside it (use it as --planner)": str(out / PLANNER_DIR)}


def lambda_stages(config: GRPOTrainConfig) -> list[tuple[str, AgentRates]]:
    """(the steps, each agent's learning-rate factor) of each λ stage of a joint run."""
    from collabrl.train.rsim import agent_lr_factors, default_switch_step

    rsim, steps = config.rsim, config.steps or None  # 0: one epoch, counted at the start
    switch = rsim.lambda_switch_step or (default_switch_step(steps) if steps else None)
    if switch is None:  # half of a run whose length the dry run does not know
        return [
            ("the first half", agent_lr_factors(1, rsim, 2)),
            ("the second half", agent_lr_factors(2, rsim, 2)),
        ]
    horizon = max(steps or 0, switch + 1)
    stages = [(f"steps 1–{switch}", agent_lr_factors(1, rsim, horizon))]
    if steps is None or switch < steps:
        last = steps or "the end"
        stages.append((f"steps {switch + 1}–{last}", agent_lr_factors(switch + 1, rsim, horizon)))
    return stages


def plan_rows(plan: TrainPlan, config: GRPOTrainConfig, args: Any, steps: int | None) -> None:
    """Each agent's learning rate as RSIMTrainer.create_scheduler applies λ: under joint
    training the planner's × λ and the reasoner's × (1 − λ), stage by stage, on top of
    the schedule; otherwise the one agent that trains, at its rate."""
    section = "rsim (λ on the learning rates)"
    rsim = config.rsim
    rates = {
        "planner": rsim.planner_learning_rate or args.learning_rate,
        "reasoner": args.learning_rate,
    }
    kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    schedule = f"then × the {kind} schedule"
    if rsim.train != "joint":
        for agent, rate in rates.items():
            shown = f"{rate:.3g} ({schedule})" if agent == rsim.train else "frozen (rsim.train)"
            plan.add(section, f"{agent} learning rate", shown)
        return
    stages = lambda_stages(config)
    for agent, rate in rates.items():
        parts = []
        for stage, factors in stages:
            factor = getattr(factors, agent)
            parts.append(f"{rate:.3g} × {factor:.2g} = {rate * factor:.3g} ({stage})")
        plan.add(section, f"{agent} learning rate", "; ".join([*parts, schedule]))


def memory_beside(plan: TrainPlan, config: GRPOTrainConfig, args: Any) -> float:
    """The planner, trained in every process under DDP: its fp32 weights, gradients and
    AdamW state, unsharded, and the activations of one chunk of its loss
    (rsim.planner_chunk decisions at the longest planner context), checkpointed where
    the policy is; GiB."""
    from collabrl.protocols.strategy import planner_context_tokens
    from collabrl.train.memory import PROMPT_TOKENS, estimate_memory, model_shape

    planner = config.protocol.planner
    if not planner:
        return 0.0
    shape = model_shape(planner)
    if shape is None:
        plan.add(MEMORY, "planner", "unknown size")
        return 0.0
    strategy = config.protocol.strategy
    decisions = args.per_device_train_batch_size * strategy.max_steps
    chunk = min(config.rsim.planner_chunk, decisions)
    context = planner_context_tokens(strategy, config.max_prompt_tokens or PROMPT_TOKENS)
    terms = estimate_memory(
        shape,
        micro_batch=chunk,
        sequence=context,
        checkpointing=args.gradient_checkpointing,
        world_size=1,  # DDP: every process holds the whole planner
        zero_stage=0,
        vllm_fraction=None,
        bf16=args.bf16,
    )
    state = terms.weights + terms.gradients + terms.optimizer
    plan.add(MEMORY, "planner weights + gradients + AdamW", f"{state:.1f} GiB")
    checkpointed = ", checkpointed" if args.gradient_checkpointing else ""
    label = (
        f"planner activations ({chunk} of up to {decisions} decisions × {context} tokens, "
        f"{'bf16' if args.bf16 else 'fp32'}{checkpointed})"
    )
    activations = terms.activations
    shown = "unknown (no config.json)" if activations is None else f"{activations:.1f} GiB"
    plan.add(MEMORY, label, shown)
    return state + (activations or 0.0)


SPEC: MethodSpec[GRPOTrainConfig] = MethodSpec(
    name="rsim",
    help="rSIM §4: a planner (--planner: a backbone model, or a saved planner folder whose "
    "training continues) and the policy trained together on the strategy protocol, "
    "λ · planner PPO-clip + (1 − λ) · reasoner GRPO; --train planner|reasoner freezes the "
    "other. OUT/planner is the trained planner.",
    protocol="strategy",
    fields=("rsim",),
    options=(MethodOption("rsim.train", ("--train",)),),
    not_offered=("strategy.planner_kind",),
    eval_steps=False,
    card="rSIM: GRPO of a reasoner led by a planner trained beside it",
    tags=("grpo", "rsim"),
    step_columns=COLUMNS,
    check=check,
    held_out=held_out,
    resumed=resumed,
    rewards=rewards,
    pin_horizons=pin_horizons,
    trainer=trainer,
    collaborators_engine=collaborators_engine,
    finish=finish,
    outputs=outputs,
    plan_rows=plan_rows,
    memory_beside=memory_beside,
)
