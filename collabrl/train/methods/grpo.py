"""`collab train grpo`: GRPO with the correctness reward, on solo (both papers'
self-exploratory baseline) or any protocol whose spec allows it (apollo's tool calls)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collabrl.train.methods.spec import MethodOption, MethodSpec

if TYPE_CHECKING:
    from collabrl.train.grpo_config import GRPOTrainConfig


def rewards(config: GRPOTrainConfig) -> list[Any]:
    from collabrl.train.rewards import accuracy

    return [accuracy]


SPEC: MethodSpec[GRPOTrainConfig] = MethodSpec(
    name="grpo",
    help="GRPO with the solo protocol (both papers' self-exploratory baseline), or with "
    "--protocol apollo: tool-integrated RL, the tools' output masked from the loss.",
    protocol="solo",
    any_grpo_protocol=True,
    options=(MethodOption("protocol.name", ("--protocol", "-p")),),
    card="GRPO on its own episodes (`collab train grpo`, on the protocol named below)",
    tags=("grpo",),
    rewards=rewards,
)
