"""`collab train relay`: RelayLLM §3.2, GRPO on relay episodes with a teacher and the
paper's simple or difficulty-aware reward (`train/rewards.relay_reward`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collabrl.train.methods.spec import MethodOption, MethodSpec

if TYPE_CHECKING:
    from collabrl.train.grpo_config import GRPOTrainConfig


def rewards(config: GRPOTrainConfig) -> list[Any]:
    from collabrl.train.rewards import relay_reward

    return [relay_reward(config)]


SPEC: MethodSpec[GRPOTrainConfig] = MethodSpec(
    name="relay",
    help="RelayLLM §3.2: GRPO on relay episodes with a teacher (--teacher), simple or "
    "difficulty-aware reward.",
    protocol="relay",
    fields=("reward", "scenario_scope", "call_ratio", "tokens_per_call"),
    options=(MethodOption("reward", ("--reward",)),),
    card="RelayLLM: GRPO with the relay protocol, calling a teacher mid-answer",
    tags=("grpo", "relay"),
    rewards=rewards,
)
