"""Which protocol runs, with which collaborators: shared by `infer`, `eval` and training."""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.config import option
from collabrl.protocols.consult import ConsultConfig
from collabrl.protocols.relay import RelayConfig
from collabrl.protocols.strategy import StrategyConfig

PROTOCOLS = ("solo", "relay", "consult", "strategy")


@dataclass
class ProtocolConfig:
    """A protocol and the models it brings in beside the policy."""

    name: str = option("solo", "solo | relay | consult | strategy (see docs/protocols/).")
    teacher: str | None = option(None, "relay: the teacher, a model reference or a base URL.")
    experts: list[str] = option(
        [],
        "consult: expert model references or base URLs; one entry serves all K experts, "
        "several are assigned round robin.",
    )
    planner: str | None = option(
        None,
        "strategy: an rSIM planner folder or backbone model reference (planner_kind rsim), "
        "or a model reference / base URL to prompt (planner_kind prompting).",
    )
    tokenizer: str | None = option(
        None, "Local tokenizer of a policy served at a URL (its token ids are recorded)."
    )
    relay: RelayConfig = option(RelayConfig(), "RelayLLM options.")
    consult: ConsultConfig = option(ConsultConfig(), "EAPO options.")
    strategy: StrategyConfig = option(StrategyConfig(), "rSIM options.")
