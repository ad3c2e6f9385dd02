"""The protocol registry: one `ProtocolSpec` per protocol, looked up by name.

Everything outside a protocol's own code that depends on which protocol runs asks its
spec: how it is built (`protocols/build.py`), which prompt the policy answers in (eval,
infer, training), the setup it refuses (`ProtocolConfig.check`), the collaborators the
dry run lists, whether `collab train grpo` may roll out on it, the extras a trainer
reads of its episodes and the ones it logs (`train/rollout.py`, `train/rewards.py`),
and the help of `--protocol`. A new protocol is one `register(spec)` call: see
docs/architecture.md, "Adding a protocol". The five built-in protocols are registered
as this module loads, from `BUILTIN` at its end (their parts: `protocols/builtin.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from collabrl.errors import UserError
from collabrl.protocols import builtin
from collabrl.protocols.strategy import strategy_extras

if TYPE_CHECKING:
    from collabrl.config import EngineConfig
    from collabrl.data.prompts import PromptTemplate
    from collabrl.episode import Episode
    from collabrl.protocols.base import CollabProtocol, Policy
    from collabrl.protocols.config import ProtocolConfig


class PolicyPrompt(Enum):
    """Which prompt the policy answers in when no `--prompt` is given."""

    BENCHMARK = "benchmark"  # the benchmark's own prompt template (solo)
    DEFAULT = "default"  # the relay template, whatever the benchmark's (relay)
    OWN = "own"  # the protocol's paper's prompts; `--prompt` is refused


# The collaborators a protocol may bring in beside the policy, by the ProtocolConfig
# key (or section, for tools) that names them.
COLLABORATORS = ("teacher", "experts", "planner", "tools")


@dataclass(frozen=True)
class BuildContext:
    """What a protocol's builder gets: its config, the loaded policy, and what the
    caller knows of the policy's model, engine, prompt and benchmark."""

    config: ProtocolConfig
    policy: Policy
    model: str  # the policy's model reference (consult's self-collab experts are copies)
    engine: EngineConfig  # the policy's engine options: collaborators derive theirs
    template: PromptTemplate  # the policy's prompt: the caller's, else the relay template
    extract_fallback: tuple[str, ...]  # the benchmark's answer extractors
    options: Any = None  # an instance of the spec's options class (`protocol.options`)

    @property
    def extract(self) -> tuple[str, ...]:
        """The answer extractors of a protocol that answers in `template`."""
        return (*self.template.extract, *self.extract_fallback)


Builder = Callable[[BuildContext], "CollabProtocol"]


def _no_check(config: ProtocolConfig) -> None:
    """A protocol whose setup needs nothing beyond the shared sub-config checks."""


def _no_reference(config: ProtocolConfig) -> bool:
    return False


def _no_extras(episode: Episode) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol: its name, how it is built, and what the rest of collabrl asks of it."""

    name: str  # `--protocol NAME`, and every episode's meta["protocol"]
    help: str  # one line without a final period, shown in the help of `--protocol`
    build: Builder  # the protocol over the policy (the caller closes it)
    # The ProtocolConfig section of its options (relay, consult, …); None: none of its own.
    section: str | None = None
    prompt: PolicyPrompt = PolicyPrompt.BENCHMARK
    # For a protocol that brings its own prompt: that prompt, from its config, as the
    # protocol itself picks it (a trainer counts the prompt's tokens before any model
    # loads); None where it is known only once the protocol runs (apollo's lists its
    # tools' schemas).
    template: Callable[[ProtocolConfig], PromptTemplate] | None = None
    # What it may bring in beside the policy (names from COLLABORATORS): the dry run lists
    # the models under the ProtocolConfig keys of the same names (teacher, experts, planner).
    collaborators: tuple[str, ...] = ()
    # Refuses a setup of this protocol that cannot run (a missing collaborator), after
    # every sub-config has been checked and before any model loads.
    check: Callable[[ProtocolConfig], None] = _no_check
    # Whether a collaborator it runs is the `reference` stand-in (outputs must say so).
    uses_reference: Callable[[ProtocolConfig], bool] = _no_reference
    # What a trainer reads of its episodes besides the common extras (train/rollout.py).
    episode_extras: Callable[[Episode], dict[str, Any]] = _no_extras
    # Those extras a GRPO step logs as batch means (`episodes/KEY`), when present.
    metric_keys: tuple[str, ...] = ()
    # Whether `collab train grpo` may roll out on it (the correctness reward); the other
    # methods roll out on their own protocol (train/grpo_config.py PROTOCOL_OF).
    grpo: bool = True
    # A dataclass of its own options, read from `protocol.options` (each field an
    # `option(default, help)`); None: it takes none there.
    options: type | None = None

    @property
    def own_prompt(self) -> bool:
        """Whether it brings its paper's prompts (no `--prompt`, no benchmark prompt)."""
        return self.prompt is PolicyPrompt.OWN

    @property
    def bench_prompt(self) -> bool:
        """Whether, without `--prompt`, the policy answers in the benchmark's prompt."""
        return self.prompt is PolicyPrompt.BENCHMARK


# The registered protocols by name, in registration order (the built-in ones first).
_SPECS: dict[str, ProtocolSpec] = {}


def register(spec: ProtocolSpec) -> ProtocolSpec:
    """Add a protocol; its name must be new (`unregister` frees one)."""
    unknown = [c for c in spec.collaborators if c not in COLLABORATORS]
    if unknown:
        raise ValueError(f"protocol {spec.name}: unknown collaborator {unknown[0]!r}")
    if spec.name in _SPECS:
        raise ValueError(f"a protocol named {spec.name!r} is already registered")
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a registered protocol (a test's, or a plugin's being replaced)."""
    _SPECS.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered protocol names, the built-in ones first."""
    return tuple(_SPECS)


def get(name: str) -> ProtocolSpec:
    """The spec of protocol `name`; a one-line UserError listing the names otherwise."""
    spec = _SPECS.get(name)
    if spec is None:
        raise UserError(f"unknown protocol '{name}'", f"use one of {', '.join(names())}")
    return spec


def find(name: object) -> ProtocolSpec | None:
    """The spec of protocol `name`, or None (an episode from an unregistered protocol)."""
    return _SPECS.get(name) if isinstance(name, str) else None


def metric_keys() -> tuple[str, ...]:
    """Every registered protocol's logged extras, each once, in registration order."""
    return tuple(dict.fromkeys(key for spec in _SPECS.values() for key in spec.metric_keys))


def protocol_help() -> str:
    """The help of `--protocol`: every registered protocol and its line."""
    listed = " ".join(f"{spec.name}: {spec.help}." for spec in _SPECS.values())
    return f"Who writes next. {listed} See docs/protocols/."


def read_options(config: ProtocolConfig) -> Any:
    """The protocol's own options from `protocol.options`, as its spec's options class
    (None for a protocol without one, which must get none)."""
    from collabrl.config import build_config

    spec = get(config.name)
    if spec.options is None:
        if config.options:
            where = f" (its own are under protocol.{spec.section})" if spec.section else ""
            raise UserError(
                f"protocol.options: the {spec.name} protocol takes no options there{where}",
                "drop protocol.options",
            )
        return None
    return build_config(spec.options, [config.options], prefix="protocol.options.")


# The five built-in protocols; their parts are in protocols/builtin.py.
BUILTIN: tuple[ProtocolSpec, ...] = (
    ProtocolSpec(
        name="solo",
        help="the policy answers alone, every paper's baseline",
        build=builtin.build_solo,
    ),
    ProtocolSpec(
        name="relay",
        help="RelayLLM, the policy hands the pen to a teacher (--teacher) for n tokens",
        build=builtin.build_relay,
        section="relay",
        prompt=PolicyPrompt.DEFAULT,
        collaborators=("teacher",),
        check=builtin.check_relay,
        uses_reference=builtin.relay_uses_reference,
        grpo=False,
    ),
    ProtocolSpec(
        name="consult",
        help="EAPO, the policy consults a panel of K experts (--expert or --self-collab)",
        build=builtin.build_consult,
        section="consult",
        prompt=PolicyPrompt.OWN,
        template=builtin.consult_template,
        collaborators=("experts",),
        check=builtin.check_consult,
        uses_reference=builtin.consult_uses_reference,
        episode_extras=builtin.consult_extras,
        metric_keys=("accept_prob",),
        grpo=False,
    ),
    ProtocolSpec(
        name="strategy",
        help="rSIM, a planner (--planner) injects a reasoning strategy before every step",
        build=builtin.build_strategy,
        section="strategy",
        prompt=PolicyPrompt.OWN,
        template=builtin.strategy_template,
        collaborators=("planner",),
        check=builtin.check_strategy,
        episode_extras=strategy_extras,
        grpo=False,
    ),
    ProtocolSpec(
        name="apollo",
        help="AlphaApollo, the policy reasons with tools (python, retrieval, MCP)",
        build=builtin.build_apollo,
        section="apollo",
        prompt=PolicyPrompt.OWN,
        collaborators=("tools",),
    ),
)

for _spec in BUILTIN:
    register(_spec)
