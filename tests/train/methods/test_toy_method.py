"""A trainable method is one module and its registration (issue 52): the toy of
`toy.py`, registered here, is a `collab train toy` command that dry-runs and trains the
tiny model, and a run derives its rollout protocol once, where it is resolved."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from collabrl.cli.main import app
from collabrl.errors import UserError
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.methods import registry
from collabrl.train.methods.spec import MethodSpec
from collabrl.train.resolve import resolve_run
from collabrl.train.rewards import reward_functions
from tests.train.methods import toy

runner = CliRunner()
RUN = [
    *("--data", "arith_train", "--limit", "4", "--steps", "1", "--prompts-per-step", "2"),
    *("--num-generations", "2", "--max-tokens", "8"),
]


@pytest.fixture
def registered() -> Iterator[None]:
    registry.register(toy.SPEC)
    toy.ROLLOUTS.clear()
    yield
    registry.unregister(toy.SPEC.name)


def test_the_toy_dry_runs_with_its_own_rows(registered: None, tiny_model_dir: Path) -> None:
    args = ["train", "toy", "--model", str(tiny_model_dir), *RUN, "--dry-run"]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "│ method" in result.output and "toy" in result.output
    assert "0.1 under 40 characters" in result.output  # its dry-run rows
    assert toy.ROLLOUTS == ["solo"]  # resolved once


def test_the_toy_trains_through_collab_train(
    registered: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ["train", "toy", "--model", str(tiny_model_dir), *RUN, "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert toy.ROLLOUTS == ["solo"]  # the whole run derived its rollout protocol once
    assert yaml.safe_load((out / "config.yaml").read_text())["method"] == "toy"
    (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][:1]
    assert "rewards/brevity/mean" in step  # its reward, TRL's log of it
    card = (out / "final" / "README.md").read_text()
    assert "- toy" in card and "Method: toy" in card


def test_the_other_methods_fields_are_refused_and_the_run_holds_the_method(
    registered: None,
) -> None:
    with pytest.raises(UserError, match="read by collab train relay only, not toy"):
        GRPOTrainConfig(method="toy", reward="simple").check()
    run = resolve_run(GRPOTrainConfig(method="toy"))
    assert run.method is toy.SPEC and run.protocol.name == "solo"
    assert "reward" in run.unread_keys()  # relay's fields stay out of its config.yaml


def test_an_unknown_method_lists_the_registered_ones(registered: None) -> None:
    with pytest.raises(UserError, match="use one of sft, grpo, relay, eapo, rsim, toy"):
        GRPOTrainConfig(method="nope").check()


def test_a_method_without_a_reward_needs_the_users() -> None:
    bare = dataclasses.replace(toy.SPEC, name="bare", rewards=MethodSpec.rewards)
    registry.register(bare)
    try:
        config = GRPOTrainConfig(method="bare", data="arith_train")
        with pytest.raises(UserError, match="no reward of its own"):
            reward_functions(config)
        config.reward_funcs = ["tests.train.methods.toy:brevity"]
        assert len(reward_functions(config)) == 1
    finally:
        registry.unregister("bare")
