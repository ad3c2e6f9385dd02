"""rollouts.jsonl keeps what TRL made of each episode: its reward, the reward's parts and
its advantage, on a real GRPO step of the tiny model, and `collab view` shows them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collabrl.config import DecodingConfig
from collabrl.train.grpo import train_grpo
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.resolve import resolve_run
from collabrl.train.run import ROLLOUTS

# A reward that differs from sample to sample and that the test can recompute from the
# episode: the sum of the completion's token ids, mod 7, over 7.
TOKEN_SUM = "def token_sum(prompts, completions, completion_ids, **kw):\n" + (
    "    return [sum(ids) % 7 / 7 for ids in completion_ids]\n"
)
GROUP = 3


def _std(values: list[float]) -> float:
    """TRL's `nanstd`: with Bessel's correction."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@pytest.mark.parametrize("scale", ["group", "none"])
def test_rollouts_keep_reward_parts_and_trls_advantage(
    tiny_model_dir: Path, tmp_path: Path, scale: str
) -> None:
    (tmp_path / "my_rewards.py").write_text(TOKEN_SUM)
    config = GRPOTrainConfig(
        model=str(tiny_model_dir),
        data="arith_train",
        limit=4,
        out=str(tmp_path / "run"),
        steps=1,
        prompts_per_step=2,
        sampling=DecodingConfig(n=GROUP, max_tokens=8, temperature=1.0),
        reward_funcs=[f"{tmp_path / 'my_rewards.py'}:token_sum"],
        save_rollouts=2 * GROUP,  # the whole batch: every group complete
        trl={"scale_rewards": scale},
    )
    train_grpo(resolve_run(config))
    kept = [json.loads(line) for line in (tmp_path / "run" / ROLLOUTS).open()]

    assert len(kept) == 2 * GROUP
    for record in kept:
        assert set(record["rewards"]) == {"accuracy", "token_sum"}  # by reward function
        assert record["rewards"]["accuracy"] == float(record["correct"])
        assert record["reward"] == pytest.approx(sum(record["rewards"].values()))
    for start in range(0, len(kept), GROUP):
        _check_group(kept[start : start + GROUP], scale)
    assert any(r["advantage"] != 0 for r in kept)  # the check above is not 0 == 0

    if scale == "group":  # the viewer on the same run, once
        from collabrl.cli.main import app

        shown = CliRunner().invoke(app, ["view", str(tmp_path / "run")])
        assert shown.exit_code == 0, shown.output
        first = kept[0]
        assert f"reward {first['reward']:.3f} (accuracy " in shown.output
        assert f"advantage {first['advantage']:+.3f}" in shown.output
        assert shown.output.count("step 1 · correct") == 2 * GROUP


def _check_group(group: list[dict], scale: str = "group") -> None:
    """One prompt group's records: each part recomputed from its own episode's tokens (so
    the numbers belong to the episode beside them), and TRL's advantage from the group's
    rewards: centred on the group's mean, divided by its std unless `scale` is none."""
    assert len({r["episode"]["problem_id"] for r in group}) == 1  # TRL's group layout
    for record in group:
        ids = [i for s in record["episode"]["segments"] for i in s["token_ids"]]
        assert record["rewards"]["token_sum"] == pytest.approx(sum(ids) % 7 / 7)
    rewards = [r["reward"] for r in group]
    mean = sum(rewards) / len(rewards)
    scale_by = _std(rewards) + 1e-4 if scale == "group" else 1.0
    expected = [(r - mean) / scale_by for r in rewards]
    assert [r["advantage"] for r in group] == pytest.approx(expected, abs=1e-5)


def test_rsim_rollouts_keep_the_reasoners_reward_parts_in_the_batch_order(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """RSIMTrainer scores through its own override: the log still gets TRL's numbers,
    record i with the batch's advantage i."""
    from collabrl.data.benchmarks import load_benchmark
    from collabrl.train.trainer import build_trainer
    from tests.train.test_rsim_trainer import _config

    config = _config(tiny_model_dir, tmp_path, save_rollouts=4)
    bench = load_benchmark(config.data, limit=config.limit)
    trainer, protocol = build_trainer(resolve_run(config), bench, tmp_path, None)
    try:
        ids = [bench.items[0].id] * 2 + [bench.items[1].id] * 2
        batch = trainer._generate_and_score_completions([{"prompt": i} for i in ids])
    finally:
        protocol.close()
    kept = [json.loads(line) for line in (tmp_path / ROLLOUTS).open()]
    assert [r["episode"]["problem_id"] for r in kept] == ids
    assert [set(r["rewards"]) for r in kept] == [{"accuracy", "step_format", "follow"}] * 4
    assert [r["advantage"] for r in kept] == pytest.approx(batch["advantages"].tolist())
    assert [r["reward"] for r in kept] == pytest.approx(
        [sum(v for v in r["rewards"].values() if v is not None) for r in kept]
    )


@pytest.mark.slow
def test_two_processes_log_the_main_process_episodes_with_their_own_scores(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Under `accelerate launch`, TRL gathers every process's rewards and slices its
    advantages per process: the main process logs its own rows of both."""
    from tests.launch import launch_two

    (tmp_path / "my_rewards.py").write_text(TOKEN_SUM)
    args = [
        "-m", "collabrl", "train", "grpo", "--model", str(tiny_model_dir),
        "--data", "arith_train", "--limit", "8", "--steps", "1", "--prompts-per-step", "4",
        "--num-generations", "2", "--max-tokens", "8", "--reward-func", "my_rewards:token_sum",
        "--out", "run",
    ]  # fmt: skip
    done = launch_two(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    kept = [json.loads(line) for line in (tmp_path / "run" / ROLLOUTS).open()]
    assert len(kept) == 4  # the main process's two groups, of the batch's four: one writer
    for start in (0, 2):
        _check_group(kept[start : start + 2])
