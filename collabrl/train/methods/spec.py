"""The type a training method (built-in or plugin) describes itself with.

A method is one module that defines `SPEC = MethodSpec(...)`: its command's help and own
options, the config fields only it reads, the protocol it rolls out on, its reward, its
trainer and callbacks, what the held-out evaluation and the model card make of it, and
the rows it adds to the dry run. `train/methods/registry.py` finds and registers the
specs; everything that depends on which method runs asks the spec, looked up once by
`config.method`.

The hooks take the method's config, whose class is the spec's type parameter: this
module cannot name `GRPOTrainConfig`, since that config looks its method's spec up (a
module importing the other back would be a cycle). It imports only lower layers and
the protocol config types, so that a method module and the registry can both import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from collabrl.config import EngineConfig
    from collabrl.protocols.base import CollabProtocol
    from collabrl.protocols.config import ProtocolConfig

C = TypeVar("C")  # the method's config class (GRPOTrainConfig, SFTTrainConfig)

# The config class of every method trained by GRPO, as "module:Class" (its command and
# `collab config show train-NAME` build it by name; importing it here would be a cycle).
GRPO_CONFIG = "collabrl.train.grpo_config:GRPOTrainConfig"


@dataclass(frozen=True)
class MethodOption:
    """A CLI option of a method's command: it sets one config key; its help is that
    config field's (`collab train relay --reward`)."""

    key: str  # dotted config key: "reward", "rsim.train"
    decls: tuple[str, ...]  # the option's declarations: ("--reward",)


def _no_check(config: Any, protocol: ProtocolConfig) -> None:
    """A method whose setup needs nothing beyond the config's own checks."""


def _as_configured(protocol: ProtocolConfig) -> ProtocolConfig:
    return protocol


def _held_out_as_trained(protocol: ProtocolConfig, run: Path | None) -> ProtocolConfig:
    return protocol


def _resumed_as_configured(protocol: ProtocolConfig, checkpoint: str) -> ProtocolConfig:
    return protocol


def _no_rewards(config: Any) -> list[Any]:
    return []  # the user's `reward_funcs` alone (train/rewards.py refuses a run with none)


def _unchanged(config: C, before: C | None) -> C:
    return config


def _no_callbacks(config: Any, protocol: CollabProtocol) -> list[Any]:
    return []


def _same_engine(engine: EngineConfig) -> EngineConfig:
    return engine


def _nothing_more(trainer: Any, out: Path, history: list[dict[str, Any]], title: str) -> None:
    """A method whose run folder holds only what every GRPO run writes."""


def _no_paths(out: Path) -> dict[str, str]:
    return {}


def _no_rows(plan: Any, config: Any, args: Any, steps: int | None) -> None:
    """A method with no section of its own in the dry run."""


def _nothing_beside(plan: Any, config: Any, args: Any) -> float:
    return 0.0


@dataclass(frozen=True)
class MethodSpec(Generic[C]):
    """One training method: its name, its command, and what the rest of collabrl asks
    of it. The defaults are plain GRPO's: TRL's trainer over the protocol as configured."""

    name: str  # `collab train NAME`, the config's `method`, the run folder's prefix
    help: str  # the help of `collab train NAME`
    # Its config class as "module:Class"; GRPO_CONFIG for the methods trained by GRPO.
    config: str = GRPO_CONFIG
    # The protocol it rolls out on when the config names none; None: it rolls nothing
    # out (sft trains on rows) and has a command of its own, not the GRPO command's body.
    protocol: str | None = None
    # Whether `--protocol` may name any registered protocol that allows GRPO
    # (`ProtocolSpec.grpo`: solo, apollo, a plugin's) rather than its own alone.
    any_grpo_protocol: bool = False
    # The config fields only this method reads: another method's run refuses them when
    # set, and leaves them out of its config.yaml.
    fields: tuple[str, ...] = ()
    # Its command's own options, after the shared ones (train/cli: DATA and RUN options).
    options: tuple[MethodOption, ...] = ()
    # Keys under `protocol.` its command offers no option for, although its protocol
    # declares one (rSIM trains an rsim planner: no --planner-kind).
    not_offered: tuple[str, ...] = ()
    # Whether the live policy may be scored during training (`eval_steps`).
    eval_steps: bool = True
    # The model card's line of what it is ("trained … by CARD"), its tags beyond
    # collabrl's and TRL's, and what a row of its data is.
    card: str = ""
    tags: tuple[str, ...] = ()
    rows: str = "problems"
    # TRL GRPOConfig arguments it sets before the config's `trl` block (eapo: DAPO's clip).
    trl: Mapping[str, Any] = field(default_factory=dict)
    # The per-step table `collab train` prints, header -> metrics.jsonl key; None: the
    # protocol's step line (`train/run.step_line_keys`).
    step_columns: Mapping[str, str] | None = None
    # The protocol the rollouts use, of the one the config names (eapo: its expert
    # channel open). Called once per run, by `train/resolve.resolve_run`.
    rollout: Callable[[ProtocolConfig], ProtocolConfig] = _as_configured
    # What the method refuses of a config, given the rollout protocol: after the config's
    # own checks, before any model loads.
    check: Callable[[C, ProtocolConfig], None] = _no_check
    # The protocol a held-out evaluation uses, of the rollout protocol: for the trained
    # policy, with its run folder (rSIM's trained planner); None: the starting policy.
    held_out: Callable[[ProtocolConfig, Path | None], ProtocolConfig] = _held_out_as_trained
    # The rollout protocol of a run resumed from `checkpoint` (rSIM's saved planner).
    resumed: Callable[[ProtocolConfig, str], ProtocolConfig] = _resumed_as_configured
    # The method's own reward functions, TRL's signature (`train/rewards.py`).
    rewards: Callable[[C], list[Any]] = _no_rewards
    # The config with its "0: the whole run" horizons as numbers; `before` is the config
    # the resumed run saved when it started (None: a fresh run).
    pin_horizons: Callable[[C, C | None], C] = _unchanged
    # The trainer class and its extra arguments; None: TRL's GRPOTrainer.
    trainer: Callable[[C, CollabProtocol], tuple[type, dict[str, Any]]] | None = None
    # Callbacks it adds to the trainer, before the reporting ones (they see its logs).
    callbacks: Callable[[C, CollabProtocol], list[Any]] = _no_callbacks
    # The engine options its local collaborators load with, of the run's.
    collaborators_engine: Callable[[EngineConfig], EngineConfig] = _same_engine
    # What it saves into the run folder after training, beside final/ and the curves.
    finish: Callable[[Any, Path, list[dict[str, Any]], str], None] = _nothing_more
    # Label -> path of what else a finished run holds (the CLI prints them, the card
    # lists them as collaborators).
    outputs: Callable[[Path], dict[str, str]] = _no_paths
    # Its own rows of the dry run (`train/plan_rows.TrainPlan`), given TRL's arguments and
    # the optimizer steps (None: one epoch of data not on this machine).
    plan_rows: Callable[[Any, C, Any, int | None], None] = _no_rows
    # Memory it holds beside the policy on every device, in GiB, its rows added to the
    # plan (rSIM's planner, trained beside the policy).
    memory_beside: Callable[[Any, C, Any], float] = _nothing_beside

    @property
    def grpo(self) -> bool:
        """Whether `collab train NAME` runs it through the GRPO trainer."""
        return self.protocol is not None
