"""Tests for collabrl.train.rewards: the method's reward functions and a user's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl.episode import EndReason
from collabrl.errors import UserError
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.rewards import accuracy, load_reward_func, reward_functions

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
