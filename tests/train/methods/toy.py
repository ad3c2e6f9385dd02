"""A toy training method, the whole of it: GRPO on the solo protocol with its own reward
(an answer's correctness, plus a bonus for a short completion) and its own dry-run
section. Registering `SPEC` (`collabrl.train.methods.registry.register`, or an entry
point in the group `collabrl.methods`) makes `collab train toy`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collabrl.train.methods.spec import MethodSpec

if TYPE_CHECKING:
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.plan_rows import TrainPlan

# How often each run derived its rollout protocol (the test reads it: once per run).
ROLLOUTS: list[str] = []


def rollout(protocol: ProtocolConfig) -> ProtocolConfig:
    ROLLOUTS.append(protocol.name)
    return protocol


def brevity(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1 for a correct answer, and 0.1 more for a completion under 40 characters."""
    short = [len(str(completion)) < 40 for completion in completions]
    return [float(c) + 0.1 * s for c, s in zip(kwargs["correct"], short, strict=True)]


def rewards(config: GRPOTrainConfig) -> list[Any]:
    return [brevity]


def plan_rows(plan: TrainPlan, config: GRPOTrainConfig, args: Any, steps: int | None) -> None:
    plan.add("toy", "bonus", "0.1 under 40 characters")


SPEC: MethodSpec[GRPOTrainConfig] = MethodSpec(
    name="toy",
    help="A toy: GRPO on solo, correctness plus a bonus for brevity.",
    protocol="solo",
    tags=("grpo", "toy"),
    rollout=rollout,
    rewards=rewards,
    plan_rows=plan_rows,
)
