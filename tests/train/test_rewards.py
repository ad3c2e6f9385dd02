"""Tests for collabrl.train.rewards: the method's reward functions and a user's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collabrl.episode import EndReason
from collabrl.errors import UserError
from collabrl.train.grpo_args import check_run
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.rewards import (
    accuracy,
    charged_ratios,
    load_reward_func,
    per_call_count,
    reward_functions,
)

USER_REWARDS = """
def brevity(prompts, completions, **kwargs):
    return [-len(c) / 100 for c in completions]

NOT_A_FUNCTION = 3
"""


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def test_a_function_in_a_file_or_module_loads(rewards_file: Path, monkeypatch) -> None:
    by_file = load_reward_func(f"{rewards_file}:brevity")
    assert by_file([], ["ab", "abcd"]) == [-0.02, -0.04]
    monkeypatch.chdir(rewards_file.parent)  # a module is found from the working directory
    assert load_reward_func("my_rewards:brevity").__name__ == "brevity"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("brevity", "is not module:function"),
        ("no_such_module_x:f", "cannot import no_such_module_x"),
        ("missing.py:f", "cannot import missing.py"),
        ("{file}:NOT_A_FUNCTION", "has no function NOT_A_FUNCTION"),
        ("{file}:absent", "has no function absent"),
    ],
)
def test_a_reward_function_that_cannot_load_is_one_error(spec, problem, rewards_file) -> None:
    with pytest.raises(UserError, match=problem):
        load_reward_func(spec.format(file=rewards_file))


def test_user_rewards_are_added_to_the_methods_or_replace_them(rewards_file: Path) -> None:
    spec = f"{rewards_file}:brevity"
    added = reward_functions(GRPOTrainConfig(reward_funcs=[spec]))
    assert [f.__name__ for f in added] == [accuracy.__name__, "brevity"]
    replaced = reward_functions(GRPOTrainConfig(reward_funcs=[spec], reward_mode="replace"))
    assert [f.__name__ for f in replaced] == ["brevity"]


def test_replace_without_a_function_is_refused() -> None:
    with pytest.raises(UserError, match="reward_mode replace needs reward_funcs"):
        GRPOTrainConfig(reward_mode="replace").check()


def test_the_evidence_call_cost_loads_as_a_users_reward() -> None:
    path = Path(__file__).parents[2] / "scripts" / "evidence" / "rewards.py"
    call_cost = load_reward_func(f"{path}:call_cost")
    assert call_cost(["p"] * 3, ["c"] * 3, calls=[0, 1, 3], correct=[True] * 3) == pytest.approx(
        [0.0, -0.1, -0.3]
    )


def test_end_reasons_are_logged_as_shares_of_the_batch() -> None:
    """Issue 32: why episodes ended was in the rollout's extras but never logged, so a
    run whose consultations all ended at `length` looked healthy."""
    logged: dict[str, float] = {}
    ends = ["eos", "length", "length", "turn_budget"]
    accuracy([], [], correct=[True] * 4, end=ends, log_metric=logged.__setitem__)
    shares = {k.removeprefix("episodes/end/"): v for k, v in logged.items() if "/end/" in k}
    assert shares == {reason.value: 0.0 for reason in EndReason} | {
        "eos": 0.25,
        "length": 0.5,
        "turn_budget": 0.25,
    }


def test_under_rollback_the_per_call_ratio_counts_the_commands_left() -> None:
    """Two calls sent, one of them served and rolled back: the per-call ρ charges both
    calls without rollback, and only the command left in the response with it."""
    extras = {"calls": [2, 1], "call_commands": [1, 0], "response_tokens": [2000, 1000]}
    sent = charged_ratios(extras, "per_call", 500, per_call_count(rollback=False))
    left = charged_ratios(extras, "per_call", 500, per_call_count(rollback=True))
    assert sent == [0.5, 0.5] and left == [0.25, 0.0]
    # The realised ratio is the realised ratio either way.
    realised = {"call_ratio": [0.1, 0.2]}
    assert charged_ratios(realised, "realised", 500, per_call_count(rollback=True)) == [0.1, 0.2]


# A user's functions as TRL calls them: each bad one is one line that names it.
BAD_REWARDS = """
import math

def raises(prompts, completions, **kwargs):
    raise ValueError("no score for this\\nsecond line")

def exits(prompts, completions, **kwargs):
    raise SystemExit(0)

def none(prompts, completions, **kwargs):
    return None

def strings(prompts, completions, **kwargs):
    return ["1.0" for _ in completions]

def short(prompts, completions, **kwargs):
    return [1.0]

def nan(prompts, completions, **kwargs):
    return [math.nan for _ in completions]

def inf(prompts, completions, **kwargs):
    return [0.0, -math.inf]

def no_kwargs(prompts, completions):
    return [0.0 for _ in completions]

def by_position(prompts, completions, /, **kwargs):
    return [0.0 for _ in completions]

def skips(prompts, completions, **kwargs):
    return [None, 0.5]

async def later(prompts, completions, **kwargs):
    return [1.0 for _ in completions]

def completions_only(completions, **kwargs):
    return [float(len(c)) for c in completions]
"""


@pytest.fixture
def bad_rewards(tmp_path: Path) -> Path:
    path = tmp_path / "bad_rewards.py"
    path.write_text(BAD_REWARDS)
    return path


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("raises", "reward function {spec} raised ValueError: no score for this$"),
        # Before, it ended the whole training run with exit 0, as if it had finished.
        ("exits", r"reward function {spec} raised SystemExit: sys.exit\(0\) was called$"),
        ("none", "reward function {spec} returned NoneType, not a list of 2 rewards"),
        ("strings", "reward function {spec} returned str '1.0' for completion 0, not a number"),
        ("short", "reward function {spec} returned 1 rewards for 2 completions"),
        ("nan", "reward function {spec} returned nan for completion 0: a reward must be finite"),
        ("inf", "reward function {spec} returned -inf for completion 1: a reward must be"),
    ],
)
def test_a_reward_function_that_fails_is_one_line_naming_it(bad_rewards, name, problem) -> None:
    spec = f"{bad_rewards}:{name}"
    reward = load_reward_func(spec)
    with pytest.raises(UserError, match=problem.format(spec=re.escape(spec))) as caught:
        reward(prompts=["p", "q"], completions=["a", "b"], completion_ids=[[1], [2]], calls=[0, 1])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("no_kwargs", "takes no \\*\\*kwargs"),
        ("by_position", "takes prompts, completions by position only"),
    ],
)
def test_a_reward_function_trl_cannot_call_is_refused_when_it_loads(bad_rewards, name, problem):
    with pytest.raises(UserError, match=problem):
        load_reward_func(f"{bad_rewards}:{name}")
    with pytest.raises(UserError, match=problem):  # and so by every run's and dry run's check
        check_run(GRPOTrainConfig(reward_funcs=[f"{bad_rewards}:{name}"]))


def test_a_builtin_is_refused_by_its_signature() -> None:
    with pytest.raises(UserError, match="builtins:len takes obj by position only"):
        load_reward_func("builtins:len")


def test_what_trl_allows_of_a_user_function_passes(bad_rewards: Path) -> None:
    """None where a function does not apply (TRL reads it as NaN, left out of the sum), an
    async function, one that names only the arguments it reads."""
    call = {"prompts": ["p", "q"], "completions": ["a", "bc"], "completion_ids": [[1], [2]]}
    assert load_reward_func(f"{bad_rewards}:skips")(**call) == [None, 0.5]
    assert load_reward_func(f"{bad_rewards}:later")(**call) == [1.0, 1.0]
    assert load_reward_func(f"{bad_rewards}:completions_only")(**call) == [1.0, 2.0]
