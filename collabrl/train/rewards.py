"""TRL reward functions over the rollout's extras (train/rollout.py `episode_extras`).

The rules themselves are pure functions in `collabrl.rewards`; these adapters only read
TRL's keyword lists, log the episodes' diagnostics through TRL's `log_metric`, and, for
RelayLLM's difficulty-aware reward, gather every process's samples first: a prompt
group may be split across processes, and its scenario is decided over the whole group
(or over the whole batch, `scenario_scope: batch`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from collabrl.episode import EndReason
from collabrl.errors import UserError
from collabrl.protocols import registry
from collabrl.protocols.relay import CALL_COMMANDS
from collabrl.rewards.eapo import eapo_reward
from collabrl.rewards.relay import (
    CALL_RATIOS,
    Outcome,
    ScenarioScope,
    group_rewards,
    per_call_ratio,
    simple_reward,
)
from collabrl.train.methods import registry as methods

if TYPE_CHECKING:
    from collabrl.train.grpo_config import GRPOTrainConfig

RewardFunc = Callable[..., list[float]]


def reward_functions(config: GRPOTrainConfig) -> list[RewardFunc]:
    """The run's reward functions (TRL sums them): the method's, the user's
    `reward_funcs` beside them, or those alone (`reward_mode: replace`)."""
    users = [load_reward_func(spec) for spec in config.reward_funcs]
    own = [] if config.reward_mode == "replace" else methods.get(config.method).rewards(config)
    funcs = [*own, *users]
    if not funcs:
        raise UserError(
            f"method {config.method} has no reward of its own and none is given",
            "pass --reward-func MODULE:FUNCTION",
        )
    return [no_credit_on_error(func) for func in funcs]


def no_credit_on_error(func: RewardFunc) -> RewardFunc:
    """`func`, paying 0 to every failed episode (`EndReason.ERROR`, the rollout's `end`
    extra) whatever it computes: such an episode stopped unfinished, and no rule, the
    user's included, may credit or penalise what it wrote before it failed (eapo's 0.1
    for a format, relay's −ρ for its calls)."""

    @functools.wraps(func)
    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        values = func(prompts, completions, **kwargs)
        ends = kwargs.get("end")
        if not ends or not isinstance(values, list) or len(values) != len(ends):
            return values  # not per episode: what is wrong is said where rewards are checked
        return [0.0 if end == EndReason.ERROR else v for v, end in zip(values, ends, strict=True)]

    return reward


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
    # Whatever the user's module raises on import; one that calls sys.exit would end the
    # run with its code (0: a success that trained nothing) before anything was said.
    except (Exception, SystemExit) as err:
        raise UserError(f"cannot import {source} (reward function {spec}): {_why(err)}") from err
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(
            f"{source} has no function {name} (reward function {spec})",
            "name a function f(prompts, completions, **kwargs) -> list[float]",
        )
    check_signature(function, spec)
    return checked(function, spec)


SIGNATURE_HINT = "write it as f(prompts, completions, **kwargs) -> list[float]"


def check_signature(function: Callable[..., Any], spec: str) -> None:
    """Refuse a function TRL cannot call: TRL 1.16 calls a reward function with keywords
    only, `f(prompts=..., completions=..., completion_ids=..., **extras)` (the extras:
    the episodes' columns, trainer_state, log_extra, log_metric), so it must take any
    keyword and no argument by position alone (`builtins:len` takes one)."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError) as err:  # some builtins have no signature to read
        raise UserError(
            f"reward function {spec} has no signature Python can read", SIGNATURE_HINT
        ) from err
    by_position = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if by_position:
        raise UserError(
            f"reward function {spec} takes {', '.join(by_position)} by position only "
            "(TRL passes every argument by keyword)",
            SIGNATURE_HINT,
        )
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        raise UserError(
            f"reward function {spec} takes no **kwargs (TRL passes completion_ids and the "
            "episodes' extras by keyword too)",
            SIGNATURE_HINT,
        )


def checked(function: Callable[..., Any], spec: str) -> RewardFunc:
    """`function`, called as TRL calls it (by keyword; an async one run to its end),
    its errors and its bad rewards one line that names it: a user's function that
    raises, or pays None for every sample, a string, NaN or the wrong number of rewards,
    would otherwise be a traceback from inside TRL, or a NaN trained on silently."""

    @functools.wraps(function)
    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        try:
            values = function(prompts=prompts, completions=completions, **kwargs)
            if inspect.isawaitable(values):
                values = asyncio.run(values)  # type: ignore[arg-type]
        except (Exception, SystemExit) as err:  # sys.exit in it would end training with 0
            raise UserError(f"reward function {spec} raised {_why(err)}") from err
        return checked_rewards(values, len(completions), spec)

    return reward


def _why(error: BaseException) -> str:
    """One line of what a user's module or function raised."""
    if isinstance(error, SystemExit):
        return f"SystemExit: sys.exit({error.code!r}) was called"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def checked_rewards(values: Any, expected: int, spec: str) -> list[float | None]:
    """`values` as one reward per completion: numbers, or None where the function does
    not apply (TRL 1.16 reads None as NaN and leaves it out of the sum; a sample that
    every function leaves out has no reward, which TRL allows). NaN and infinity are
    refused: TRL would train on them (a NaN advantage, an infinite loss)."""
    if hasattr(values, "tolist") and not isinstance(values, list):  # numpy, torch
        values = values.tolist()
    if not isinstance(values, list | tuple):
        raise UserError(
            f"reward function {spec} returned {type(values).__name__}, "
            f"not a list of {expected} rewards",
            SIGNATURE_HINT,
        )
    if len(values) != expected:
        raise UserError(
            f"reward function {spec} returned {len(values)} rewards for {expected} completions",
            "return one reward per completion, in their order",
        )
    for i, value in enumerate(values):
        if value is None:
            continue
        if not isinstance(value, numbers.Real):
            raise UserError(
                f"reward function {spec} returned {type(value).__name__} {value!r:.40} "
                f"for completion {i}, not a number",
                "return a float per completion (None where it does not apply)",
            )
        if not math.isfinite(value):
            raise UserError(
                f"reward function {spec} returned {value} for completion {i}: a reward "
                "must be finite",
                "return a finite float (None where it does not apply)",
            )
    return list(values)


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


def relay_reward(config: GRPOTrainConfig) -> RewardFunc:
    """RelayLLM's reward of `config.reward`, with the run's ρ(y) (`call_ratio`,
    `tokens_per_call`, and what a per-call ρ counts under `protocol.relay.rollback`) and,
    for the difficulty-aware one, its `scenario_scope`."""
    charge = {
        "ratio": config.call_ratio,
        "tokens_per_call": config.tokens_per_call,
        "counted": per_call_count(config.protocol.relay.rollback),
    }
    if config.reward == "simple":
        reward = functools.partial(relay_simple, **charge)
        function: RewardFunc = relay_simple
    else:
        reward = functools.partial(relay_difficulty_aware, scope=config.scenario_scope, **charge)
        function = relay_difficulty_aware
    return functools.update_wrapper(reward, function)  # TRL logs a reward under its __name__


# What the rewards paid for (a truncated episode's last number earns nothing), and the
# share of answers in the prompt's format (lm-eval's strict-match; `rewards.score`).
ACCURACY_NAMES = {"correct": "accuracy", "strict_correct": "strict_accuracy"}


def log_episodes(kwargs: dict[str, Any]) -> None:
    """Batch means of what the episodes did, as TRL metrics (`episodes/...`), and the
    share of episodes that ended for each reason (`episodes/end/REASON`, every protocol's
    `EndReason`: a consult run whose calls end at `length` shows it here)."""
    log = kwargs.get("log_metric")
    if log is None:
        return
    keys = ("correct", "strict_correct", "call_ratio", "call_ratio_requested", "calls")
    keys += ("accepted_calls",)
    keys += ("format_errors", "tool_calls", "tool_errors")
    # What the protocols' specs log of their own extras (consult: accept_prob).
    keys += registry.metric_keys()
    keys += ("rollout_seconds", "identical_groups", "empty")
    for key in (k for k in dict.fromkeys(keys) if k in kwargs):  # a protocol's: when it ran
        values = [float(v) for v in kwargs[key]]
        name = ACCURACY_NAMES.get(key, key)
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


def per_call_count(rollback: bool) -> str:
    """The extra whose count of calls the per-call ρ charges: every call sent to the
    teacher (`calls`), or, when `relay.rollback` takes the served calls' commands out of
    the response as the authors' rollout does, the commands left in it (`call_commands`:
    the unserved calls), which is all the authors' reward can count. A sample whose calls
    were all served then has ρ 0 and counts as not calling."""
    return CALL_COMMANDS if rollback else "calls"


def charged_ratios(
    kwargs: dict[str, Any], ratio: str, tokens_per_call: int, counted: str
) -> list[float]:
    """Each episode's ρ(y) as the run's `call_ratio` counts it: the realised ratio (the
    `call_ratio` extra, logged as episodes/call_ratio), or the released code's per-call
    count of the extra `counted` (`per_call_count`; logged as episodes/call_ratio_per_call,
    so a run's logs say which it charged)."""
    if ratio == "realised":
        return [float(r) for r in kwargs["call_ratio"]]
    if ratio != "per_call":
        raise ValueError(f"unknown call ratio {ratio!r}; known: {', '.join(CALL_RATIOS)}")
    pairs = zip(kwargs[counted], kwargs["response_tokens"], strict=True)
    ratios = [per_call_ratio(int(calls), int(tokens), tokens_per_call) for calls, tokens in pairs]
    log = kwargs.get("log_metric")
    if log is not None and ratios:
        log("episodes/call_ratio_per_call", sum(ratios) / len(ratios))
    return ratios


def relay_simple(
    prompts: list[Any],
    completions: list[Any],
    *,
    ratio: str,
    tokens_per_call: int,
    counted: str,
    **kwargs: Any,
) -> list[float]:
    """RelayLLM's simple reward, 1(a=g) − ρ(y), ρ counted as `ratio` says."""
    log_episodes(kwargs)
    ratios = charged_ratios(kwargs, ratio, tokens_per_call, counted)
    return [simple_reward(c, r) for c, r in zip(kwargs["correct"], ratios, strict=True)]


def relay_difficulty_aware(
    prompts: list[Any],
    completions: list[Any],
    *,
    ratio: str,
    tokens_per_call: int,
    scope: ScenarioScope,
    counted: str,
    **kwargs: Any,
) -> list[float]:
    """RelayLLM's difficulty-aware reward, each scenario decided over every process's
    samples: of its prompt group, or of the whole batch (`scope`)."""
    from accelerate.utils import gather_object

    log_episodes(kwargs)
    ratios = charged_ratios(kwargs, ratio, tokens_per_call, counted)
    local = [
        (problem, Outcome(bool(c), r))
        for problem, c, r in zip(kwargs["problem_id"], kwargs["correct"], ratios, strict=True)
    ]
    everyone = gather_object([local])  # one list per process, in process order
    rewards = group_rewards([s for part in everyone for s in part], "difficulty_aware", scope)
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
