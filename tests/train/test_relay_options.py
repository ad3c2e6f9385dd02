"""RelayLLM's options that follow the authors' released code instead of the paper's text
(`protocol.relay.train_teacher_tokens`, `protocol.relay.rollback`, `scenario_scope`,
`call_ratio`, `tokens_per_call`): listed with their help, refused where the run would not read them,
and, set as `collab train relay --set` sets them, reaching the rollout and the reward."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from collabrl.cli.options import load_config
from collabrl.data.benchmarks import load_benchmark
from collabrl.episode import Author
from collabrl.errors import UserError
from collabrl.models import load_model, load_tokenizer
from collabrl.rewards.relay import per_call_ratio
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.resolve import resolve_run
from collabrl.train.rewards import reward_functions
from collabrl.train.trainer import training_rollout
from tests.train.test_rollout import CALL_THEN_ANSWER, SampledPolicy

PAPER_CONFIG = Path(__file__).parents[2] / "configs" / "train" / "relay-qwen3-1.7b.yaml"
AUTHORS_CODE = [
    "protocol.relay.train_teacher_tokens=true",
    "scenario_scope=batch",
    "call_ratio=per_call",
    "tokens_per_call=250",
]
# The authors' rollout: a served call's segment rolled back (with the above, their
# effective setting).
ROLLBACK = "protocol.relay.rollback=true"


def _shown(sets: list[str]) -> tuple[dict, str]:
    """`collab config show train-relay -c <the paper config> --set …`: the YAML and its text."""
    from typer.testing import CliRunner

    from collabrl.cli.main import app

    args = ["config", "show", "train-relay", "-c", str(PAPER_CONFIG)]
    result = CliRunner().invoke(app, [*args, *(a for s in sets for a in ("--set", s))])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout), result.stdout


# Each option, and a word of the help line `config show` writes above it.
HELP = {
    "train_teacher_tokens": "distillation",
    "rollback": "rolls back the policy's segment",
    "scenario_scope": "math_help_group.py",
    "call_ratio": "per_call",
    "tokens_per_call": "the tokens each call counts",
}


def test_config_show_lists_each_option_with_its_help_and_the_papers_defaults() -> None:
    shown, text = _shown([])
    assert shown["protocol"]["relay"]["train_teacher_tokens"] is False
    assert shown["protocol"]["relay"]["rollback"] is False
    defaults = (shown["scenario_scope"], shown["call_ratio"], shown["tokens_per_call"])
    assert defaults == ("group", "realised", 500)
    lines = text.splitlines()
    for key, word in HELP.items():
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"{key}:"))
        assert lines[at - 1].lstrip().startswith("# ") and word in lines[at - 1], key
    changed, _ = _shown([*AUTHORS_CODE, ROLLBACK])
    assert changed["protocol"]["relay"]["train_teacher_tokens"] is True
    assert changed["protocol"]["relay"]["rollback"] is True
    chosen = (changed["scenario_scope"], changed["call_ratio"], changed["tokens_per_call"])
    assert chosen == ("batch", "per_call", 250)


@pytest.mark.parametrize("rollback", [False, True])
def test_the_options_set_on_the_command_line_reach_the_rollout_and_the_reward(
    tiny_model_dir: Path, smol_tokenizer, rollback: bool
) -> None:
    layer = {"model": str(tiny_model_dir), "limit": 1, "protocol": {"teacher": "reference"}}
    config = load_config("train-relay", None, layer, AUTHORS_CODE + [ROLLBACK] * rollback)
    config.check()
    bench = load_benchmark(config.data, limit=config.limit)
    model, tokenizer = load_model(config.model), load_tokenizer(config.model)
    rollout = training_rollout(resolve_run(config), bench, model, tokenizer)
    try:
        assert rollout.protocol.config.train_teacher_tokens is True
        assert rollout.protocol.config.rollback is rollback
        # The run's own protocol, its policy scripted to call once and then answer.
        rollout.protocol.policy.engine = SampledPolicy(smol_tokenizer, list(CALL_THEN_ANSWER))
        [item] = bench.items
        episodes = rollout.protocol.run(rollout.tasks([item.id], 0), rollout.params)
        out = rollout.to_trl(episodes)
    finally:
        rollout.protocol.close()
    [episode] = episodes
    assert any(s.author is Author.TEACHER and s.token_ids for s in episode.segments)
    assert out["env_mask"] == [[1] * len(episode.response_ids)]  # the teacher's trained too
    # Under rollback the policy's calling segment left the completion TRL trains on.
    assert [s.rolled_back for s in episode.segments] == [rollback, False, False]

    [reward] = reward_functions(config)
    assert reward.__name__ == "relay_difficulty_aware"
    logged: dict[str, float] = {}
    [value] = reward(["p"], ["c"], **out, log_metric=logged.__setitem__)
    if rollback:
        # The served call's command was rolled back: no call left to charge, so the
        # sample counts as not calling (one sample: right alone is 1.5, wrong is 0).
        assert logged["episodes/call_ratio_per_call"] == 0.0
        assert value == (1.5 if out["correct"][0] else 0.0)
        return
    rho = per_call_ratio(1, len(episode.response_ids), 250)  # one call at 250 tokens
    assert logged["episodes/call_ratio_per_call"] == pytest.approx(rho)
    assert rho != pytest.approx(out["call_ratio"][0])  # not the realised ratio
    # One sample, one group, one batch: right with a call is 1 − ρ, wrong is ρ (scenario 3).
    assert value == pytest.approx(1 - rho if out["correct"][0] else rho)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"scenario_scope": "prompt"}, "scenario_scope must be group or batch"),
        ({"call_ratio": "requested"}, "call_ratio must be realised or per_call"),
        ({"call_ratio": "per_call", "tokens_per_call": 0}, "tokens_per_call must be at least 1"),
        ({"reward": "simple", "scenario_scope": "batch"}, "read by the difficulty_aware reward"),
        ({"tokens_per_call": 250}, "tokens_per_call is read with call_ratio per_call only"),
    ],
)
def test_a_setting_the_relay_reward_cannot_use_is_refused(changes: dict, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        GRPOTrainConfig(method="relay", **changes).check()


@pytest.mark.parametrize("key", ["scenario_scope", "call_ratio", "tokens_per_call"])
def test_another_methods_run_refuses_the_relay_reward_settings(key: str) -> None:
    value = {"scenario_scope": "batch", "call_ratio": "per_call", "tokens_per_call": 250}[key]
    with pytest.raises(UserError, match=f"{key} is read by collab train relay only"):
        GRPOTrainConfig(method="grpo", **{key: value}).check()
