"""A GRPO run resolved once, at its start: `resolve_run` checks the config, looks its
method up and derives the protocol the rollouts use; what is below (the trainer, the
held-out evaluation, the model card, the dry run, the prompt counts) reads the
`ResolvedRun` it returns and derives none of it again.

The horizons a run fills in once its folder is known (steps 0: one epoch; the
schedules' "0: the whole run") come in through `ResolvedRun.with_config`: the method and
the rollout protocol do not depend on them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collabrl.errors import UserError
from collabrl.protocols import registry
from collabrl.protocols.saved import unread_protocol_keys
from collabrl.train.grpo_config import GRPOTrainConfig, others_fields
from collabrl.train.methods import registry as methods

if TYPE_CHECKING:
    from collabrl.data.prompts import PromptTemplate
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.protocols.spec import ProtocolSpec
    from collabrl.train.methods.spec import MethodSpec


@dataclass(frozen=True)
class ResolvedRun:
    """A checked config, its method's spec, and the protocol its rollouts use."""

    config: GRPOTrainConfig
    method: MethodSpec[GRPOTrainConfig]
    protocol: ProtocolConfig  # the rollouts' (eapo: its expert channel open)
    protocol_spec: ProtocolSpec
    collaborators: tuple[str, ...]  # the model references and URLs it serves beside the policy

    def with_config(self, config: GRPOTrainConfig) -> ResolvedRun:
        """The same run with its horizons filled in (`pin_steps`, `pin_horizons`)."""
        return dataclasses.replace(self, config=config)

    def prompt(self, bench_prompt: str) -> str | None:
        """The policy's prompt name: None when the rollout protocol brings its paper's
        own (its registry spec says so: consult, strategy, apollo)."""
        if self.protocol_spec.own_prompt:
            return None
        return self.config.prompt or bench_prompt

    def own_template(self) -> PromptTemplate | None:
        """The template of a rollout protocol that brings its paper's prompts, as its spec
        says the protocol picks it; None for one that answers in the data's or the run's
        prompt. A protocol whose prompt is known only once it runs (apollo's lists its
        tools' schemas) is refused: its prompt length cannot be counted."""
        spec = self.protocol_spec
        if not spec.own_prompt:
            return None
        if spec.template is not None:
            return spec.template(self.protocol)
        raise UserError(
            f"max_prompt_tokens is not offered for the {spec.name} protocol "
            "(its prompt is known only once its collaborators start)",
            "drop max_prompt_tokens",
        )

    def unread_keys(self) -> frozenset[str]:
        """What the run's config.yaml leaves out (`unread_keys`)."""
        return unread_keys(self.config, self.protocol)


def unread_keys(config: GRPOTrainConfig, protocol: ProtocolConfig) -> frozenset[str]:
    """What the config.yaml of a run of `config` rolling out on `protocol` leaves out: the
    fields other methods alone read and the protocol keys `protocol` never reads
    (`protocols/saved.py`)."""
    return frozenset(others_fields(config.method)) | unread_protocol_keys(protocol)


def resolve_run(config: GRPOTrainConfig) -> ResolvedRun:
    """Check `config` and resolve it, before any data or model loads: its own checks,
    then its method's rollout protocol (the one place it is derived), that protocol's
    setup and the method's checks of it, and a prompt limit where the prompt is known."""
    config.check()
    method = methods.get(config.method)
    protocol = method.rollout(dataclasses.replace(config.protocol))
    registry.check_protocol_config(protocol)
    method.check(config, protocol)
    run = ResolvedRun(
        config=config,
        method=method,
        protocol=protocol,
        protocol_spec=registry.get(protocol.name),
        collaborators=tuple(registry.collaborators_of(protocol)),
    )
    if config.max_prompt_tokens is not None:
        run.own_template()  # refused where the prompt is known only at run time (apollo)
    return run
