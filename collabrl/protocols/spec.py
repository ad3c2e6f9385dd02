"""The types a protocol module (built-in or plugin) describes itself with.

A protocol is one module that defines its class and, next to it, `SPEC = ProtocolSpec(...)`:
how it is built, the prompt its policy answers in, the setup it refuses, the models or
services it brings in beside the policy (`Collaborator`s) and its own CLI options (`Flag`s).
`protocols/registry.py` holds the mechanism that finds and registers the specs. This module
imports only lower layers and the config types, never the registry or a protocol module,
so that a protocol module and the registry can both import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from collabrl.episode import Author

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


@dataclass(frozen=True)
class Flag:
    """A CLI option of a protocol: it sets one config key; its help is that config field's."""

    key: str  # dotted under `protocol.`: "consult.self_collab", "options.critic"
    decls: tuple[str, ...]  # the option's declarations: ("--self-collab",)


def _always(config: ProtocolConfig) -> bool:
    return True


@dataclass(frozen=True)
class Collaborator:
    """A model or service a protocol brings in beside the policy, declared once: the CLI
    builds its flag from it, the config check refuses it under another protocol, the dry
    run lists it and eval probes it when it is served."""

    name: str  # what messages and the dry run call it: "teacher", "experts", "tools"
    # Its config key under `protocol.`: "teacher", "experts", "planner", "apollo" (tools:
    # the section), or "options.KEY" for a plugin's (its options class's field KEY).
    key: str
    flag: str | None  # "--teacher"; None: set through the config only (tools)
    # Whether its value is a model reference or base URL that may be served (the dry run
    # lists it, eval probes a URL); False: it runs in-process only.
    served: bool
    many: bool = False  # a list of references (experts): the flag repeats
    # The Author of the segments it writes; None: it writes none of its own. A served
    # model's author must count as help in the call ratio (`collabrl.episode.HELPERS`).
    author: Author | None = None
    # For a collaborator served in some setups only, which (strategy's planner: prompted,
    # not the in-process rSIM planner); the default is whenever `served`.
    served_when: Callable[[ProtocolConfig], bool] = _always

    def serves(self, config: ProtocolConfig) -> bool:
        """Whether this run calls it as a model reference or base URL."""
        return self.served and self.served_when(config)


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


def _always_calls(config: ProtocolConfig) -> bool:
    return True


def _no_extras(episode: Episode) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol: its name, how it is built, and what the rest of collabrl asks of it."""

    name: str  # `--protocol NAME`, and every episode's meta["protocol"]
    help: str  # one line without a final period, shown in the help of `--protocol`
    build: Builder  # the protocol over the policy (the caller closes it)
    # The ProtocolConfig section of its options (relay, consult, …); None: none of its own.
    # Any protocol may claim one, a plugin too, sharing it with the protocol it is named for.
    section: str | None = None
    prompt: PolicyPrompt = PolicyPrompt.BENCHMARK
    # For a protocol that brings its own prompt: that prompt, from its config, as the
    # protocol itself picks it (a trainer counts the prompt's tokens before any model
    # loads); None where it is known only once the protocol runs (apollo's lists its
    # tools' schemas).
    template: Callable[[ProtocolConfig], PromptTemplate] | None = None
    # What it brings in beside the policy: the CLI's flags, the check that refuses them
    # under another protocol, the dry run's listing and eval's probe all read these.
    collaborators: tuple[Collaborator, ...] = ()
    # Its own CLI options besides its collaborators' (consult's --self-collab).
    flags: tuple[Flag, ...] = ()
    # Refuses a setup of this protocol that cannot run (a missing collaborator), after
    # every sub-config has been checked and before any model loads. Its errors name the
    # collaborator's flag; a command without that flag rewrites it into `--set`.
    check: Callable[[ProtocolConfig], None] = _no_check
    # Whether a collaborator it runs is the `reference` stand-in (outputs must say so).
    uses_reference: Callable[[ProtocolConfig], bool] = _no_reference
    # What the policy writes to call a collaborator when only a warm-up teaches it
    # (relay's `<call>n</call>`): training warns of a policy never warmed up on it
    # (eval/cautions.py) and names `collab build-warmup NAME`. None: no warm-up needed.
    call_syntax: str | None = None
    # Whether this setup lets the policy call at all (relay's teacher-free mode and
    # consult's locked mode do not); read where `call_syntax` is set.
    calls: Callable[[ProtocolConfig], bool] = _always_calls
    # What a trainer reads of its episodes besides the common extras (train/rollout.py).
    episode_extras: Callable[[Episode], dict[str, Any]] = _no_extras
    # Those extras a GRPO step logs as batch means (`episodes/KEY`), when present.
    metric_keys: tuple[str, ...] = ()
    # Whether `collab train grpo` may roll out on it (the correctness reward); the other
    # methods roll out on their own protocol (each MethodSpec in train/methods/ names its protocol).
    grpo: bool = True
    # A dataclass of its own options, read from `protocol.options` (each field an
    # `option(default, help)`; its `check()`, where it has one, runs before any model
    # loads, as a section's does); None: it takes none there.
    options: type | None = None

    @property
    def own_prompt(self) -> bool:
        """Whether it brings its paper's prompts (no `--prompt`, no benchmark prompt)."""
        return self.prompt is PolicyPrompt.OWN

    @property
    def bench_prompt(self) -> bool:
        """Whether, without `--prompt`, the policy answers in the benchmark's prompt."""
        return self.prompt is PolicyPrompt.BENCHMARK
