"""Which protocol runs, with which collaborators: shared by `infer`, `eval` and training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collabrl.config import option
from collabrl.engines import is_url
from collabrl.engines.reference import stand_in_accuracy
from collabrl.errors import UserError
from collabrl.protocols import registry
from collabrl.protocols.apollo import ApolloConfig
from collabrl.protocols.consult import ConsultConfig
from collabrl.protocols.relay import RelayConfig
from collabrl.protocols.strategy import StrategyConfig


@dataclass
class ProtocolConfig:
    """A protocol and the models it brings in beside the policy."""

    name: str = option(
        "solo",
        "solo | relay | consult | strategy | apollo, or a protocol registered in code "
        "(see docs/protocols/).",
    )
    teacher: str | None = option(
        None,
        "relay: the teacher, a model reference or a base URL; 'reference' is a stand-in "
        "that writes the gold answer (demos and tests only).",
    )
    experts: list[str] = option(
        [],
        "consult: expert model references or base URLs; one entry serves all K experts, "
        "several are assigned round robin; 'reference' is a stand-in that writes the gold "
        "answer (demos and tests only).",
    )
    planner: str | None = option(
        None,
        "strategy: an rSIM planner folder or backbone model reference (planner_kind rsim), "
        "or a model reference / base URL to prompt (planner_kind prompting).",
    )
    tokenizer: str | None = option(
        None, "Local tokenizer of a policy served at a URL (its token ids are recorded)."
    )
    chat_template_kwargs: dict[str, Any] = option(
        {},
        "Chat-template options of the collaborators (teacher, experts, prompted planner), "
        "e.g. {enable_thinking: false} for Qwen3's non-thinking mode as RelayLLM runs it; "
        "sent to OpenAI-compatible servers in the request. The policy's are "
        "engine.chat_template_kwargs.",
    )
    relay: RelayConfig = option(RelayConfig(), "RelayLLM options.")
    consult: ConsultConfig = option(ConsultConfig(), "EAPO options.")
    strategy: StrategyConfig = option(StrategyConfig(), "rSIM options.")
    apollo: ApolloConfig = option(ApolloConfig(), "AlphaApollo options: the tools.")
    options: dict[str, Any] = option(
        {},
        "Options of a protocol registered in code with its own options class "
        "(e.g. --set protocol.options.KEY=VALUE); the built-in ones take none here.",
    )

    def check(self) -> None:
        """Refuse a setup that cannot run, before any model is loaded: every sub-config
        is checked, whichever protocol runs, so a typo never waits for a model load."""
        spec = registry.get(self.name)  # an unknown name lists the registered ones
        self.relay.check()
        self.consult.check()
        self.strategy.check()
        self.apollo.check()
        registry.read_options(self)
        self.check_collaborators(spec.collaborators)
        for ref in (self.teacher, *self.experts):
            if ref:
                stand_in_accuracy(ref)  # `reference@2` is refused here, not at its first call
        spec.check(self)  # the protocol's own setup: e.g. relay needs a teacher
        if self.strategy.planner_kind == "rsim" and self.planner and is_url(self.planner):
            raise UserError(
                f"an rsim planner runs in-process and cannot be reached at {self.planner}",
                "pass a planner folder or a model reference, or --planner-kind prompting",
            )

    def check_collaborators(self, needed: tuple[str, ...]) -> None:
        """Refuse a collaborator the protocol never calls (`--protocol solo --teacher X`
        would otherwise run without it, silently)."""
        given = {"teacher": self.teacher is not None, "experts": bool(self.experts)}
        given["planner"] = self.planner is not None
        for key in (key for key, is_given in given.items() if is_given and key not in needed):
            users = [name for name in registry.names() if key in registry.get(name).collaborators]
            raise UserError(
                f"protocol.{key} is set, but the {self.name} protocol has no {key}",
                f"drop it, or use a protocol that has: {', '.join(users)}",
            )

    def uses_reference(self) -> bool:
        """Whether a collaborator that this protocol runs is the `reference` stand-in,
        which reads each task's gold answer (outputs must say so)."""
        return registry.get(self.name).uses_reference(self)


def collaborators_of(protocol: ProtocolConfig) -> list[str]:
    """The models the protocol calls beside the policy: relay's teacher, consult's
    experts (rsim's planner trains in-process; the protocol's own check reads it)."""
    return [ref for ref in (protocol.teacher, *protocol.experts) if ref]
