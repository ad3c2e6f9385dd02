"""TRL reward functions over the rollout's extras (train/rollout.py `episode_extras`).

The rules themselves are pure functions in `collabrl.rewards`; these adapters only read
TRL's keyword lists, log the episodes' diagnostics through TRL's `log_metric`, and, for
RelayLLM's difficulty-aware reward, gather every process's samples first: a prompt
group may be split across processes, and its scenario is decided over the whole group.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from collabrl.episode import EndReason
from collabrl.errors import UserError
from collabrl.protocols import registry
from collabrl.rewards.eapo import eapo_reward
from collabrl.rewards.relay import Outcome, group_rewards, simple_reward

if TYPE_CHECKING:
    from collabrl.train.grpo_config import GRPOTrainConfig

RewardFunc = Callable[..., list[float]]


def reward_functions(config: GRPOTrainConfig) -> list[RewardFunc]:
    """The run's reward functions (TRL sums them): the method's, the user's
    `reward_funcs` beside them, or those alone (`reward_mode: replace`)."""
    users = [load_reward_func(spec) for spec in config.reward_funcs]
    return users if config.reward_mode == "replace" else [*method_rewards(config), *users]


def load_reward_func(spec: str) -> RewardFunc:
    """The function `module:function` or `path/to/file.py:function` names; a module is
    looked up from the working directory too, where a user keeps a rewards file."""
    source, sep, name = spec.rpartition(":")
    if not (sep and source and name):
        raise UserError(
            f"reward function '{spec}' is not module:function",
            "write e.g. my_rewards:length_penalty or path/to/rewards.py:length_penalty",
        )
    try:
        module = _import_file(source) if source.endswith(".py") else _import_module(source)
    except Exception as err:  # whatever the user's module raises on import
        problem = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"cannot import {source} (reward function {spec}): {problem}") from err
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(
            f"{source} has no function {name} (reward function {spec})",
            "name a function f(prompts, completions, **kwargs) -> list[float]",
        )
    return function


def _import_module(name: str) -> ModuleType:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def _import_file(path: str) -> ModuleType:
    if not Path(path).is_file():
        raise FileNotFoundError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def method_rewards(config: GRPOTrainConfig) -> list[RewardFunc]:
    """The reward of a method: correctness for grpo, RelayLLM's for relay, EAPO's for eapo."""
    if config.method == "grpo":
        return [accuracy]
    if config.method == "rsim":
        return [accuracy, step_format, follow]  # rSIM's R = R_acc + R_format + R_follow
    if config.method == "eapo":
        reward = functools.partial(eapo, penalty=config.consult_penalty)
        functools.update_wrapper(reward, eapo)  # TRL logs a reward under its __name__
        return [reward]
    return [relay_simple] if config.reward == "simple" else [relay_difficulty_aware]


def log_episodes(kwargs: dict[str, Any]) -> None:
    """Batch means of what the episodes did, as TRL metrics (`episodes/...`), and the
    share of episodes that ended for each reason (`episodes/end/REASON`, every protocol's
    `EndReason`: a consult run whose calls end at `length` shows it here)."""
    log = kwargs.get("log_metric")
    if log is None:
        return
    keys = ("correct", "call_ratio", "call_ratio_requested", "calls", "accepted_calls")
    keys += ("format_errors", "tool_calls", "tool_errors")
    # What the protocols' specs log of their own extras (consult: accept_prob).
    keys += registry.metric_keys()
    keys += ("rollout_seconds", "identical_groups", "empty")
    for key in (k for k in dict.fromkeys(keys) if k in kwargs):  # a protocol's: when it ran
        values = [float(v) for v in kwargs[key]]
        name = "accuracy" if key == "correct" else key
        log(f"episodes/{name}", sum(values) / len(values))
    ends = kwargs.get("end")
    if ends:
        # Every reason, 0 included: TRL averages a metric over the steps that logged it,
        # so one logged only when it occurs would read as if it always did.
        for reason in EndReason:
            log(f"episodes/end/{reason}", sum(end == reason for end in ends) / len(ends))


def accuracy(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1 when the episode's answer is equivalent to the reference, else 0."""
    log_episodes(kwargs)
    return [float(c) for c in kwargs["correct"]]


def relay_simple(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """RelayLLM's simple reward, 1(a=g) − ρ(y), on the realised call ratio."""
    log_episodes(kwargs)
    pairs = zip(kwargs["correct"], kwargs["call_ratio"], strict=True)
    return [simple_reward(correct, ratio) for correct, ratio in pairs]


def relay_difficulty_aware(
    prompts: list[Any], completions: list[Any], **kwargs: Any
) -> list[float]:
    """RelayLLM's difficulty-aware reward, each group's scenario decided over the group's
    samples from every process."""
    from accelerate.utils import gather_object

    log_episodes(kwargs)
    local = [
        (problem, Outcome(bool(c), float(r)))
        for problem, c, r in zip(
            kwargs["problem_id"], kwargs["correct"], kwargs["call_ratio"], strict=True
        )
    ]
    everyone = gather_object([local])  # one list per process, in process order
    rewards = group_rewards([s for part in everyone for s in part], "difficulty_aware")
    start = sum(len(part) for part in everyone[: _process_index()])
    return rewards[start : start + len(local)]


def _process_index() -> int:
    from accelerate import PartialState

    return PartialState().process_index


def eapo(
    prompts: list[Any], completions: list[Any], penalty: float = 0.0, **kwargs: Any
) -> list[float]:
    """EAPO's reward: the answer's token F1 if non-zero, 0.1 for a well-formed answer
    line with F1 0, else 0 (less `penalty` per expert call)."""
    log_episodes(kwargs)
    rows = zip(kwargs["f1"], kwargs["format_ok"], kwargs["calls"], strict=True)
    return [eapo_reward(f1, ok, penalty, calls) for f1, ok, calls in rows]


def step_format(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """rSIM's R_format: 1 when the reasoner's own text boxes a final answer."""
    return [float(v) for v in kwargs["step_format"]]


def follow(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """rSIM's R_follow: the share of guided steps whose text follows their strategy."""
    return [float(v) for v in kwargs["follow"]]
