"""`collab train grpo|relay|eapo|rsim` as a user runs them: a real process on the tiny model,
one-line refusals, and the shared config listing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli import COLLAB, assert_one_line_error, collab

GRPO_CONFIG = Path(__file__).parents[2] / "configs" / "train" / "grpo-cpu-arith.yaml"


def test_relay_trains_with_the_reference_teacher(tiny_model_dir: Path, tmp_path: Path) -> None:
    brevity = "def brevity(prompts, completions, **kw):\n    return [0.0 for _ in completions]\n"
    (tmp_path / "my_rewards.py").write_text(brevity)
    result = collab(
        "train", "relay", "--model", str(tiny_model_dir), "--teacher", "reference",
        "--reward-func", "my_rewards:brevity",
        "--data", "arith_train", "--limit", "4", "--steps", "1", "--prompts-per-step", "2",
        "--num-generations", "2", "--max-tokens", "12", "--eval-data", "arith",
        "--eval-limit", "2", "--report-to", "tensorboard", "--out", "run", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "method: relay" in config and "teacher: reference" in config
    # A batch log (no terminal here) keeps a line per step, and TensorBoard its events.
    assert "step 1/1 · reward " in result.stdout and " · call ratio " in result.stdout
    assert "evaluating the final policy" in result.stdout
    assert list((tmp_path / "run").glob("**/events.out.tfevents.*"))
    logged = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert logged[0]["step"] == 1 and "episodes/call_ratio" in logged[0]
    assert "rewards/brevity/mean" in logged[0]  # the user's reward, beside relay's
    kept = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").open()]
    assert [r["step"] for r in kept] == [1] * 4 and "segments" in kept[0]["episode"]
    shown = collab("train", "rollouts", "run", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("step 1 · correct") == 4 and "authors:" in shown.stdout
    missing = collab("train", "rollouts", "run", "--step", "7", cwd=tmp_path)
    assert_one_line_error(missing, "step 7 was not kept")
    assert "final" in result.stdout
    assert "held-out arith" in result.stdout and (tmp_path / "run" / "eval.json").is_file()
    assert "of 2 problems: " in result.stdout and " newly solved, " in result.stdout
    # TRL's own warnings (experimental rollout_func, a deprecated property it reads) are ours
    # to filter: a user's run prints none.
    assert "rollout_func" not in result.stderr and "is_gradient_checkpointing" not in result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["relay"], "needs a teacher"),
        (["eapo"], "needs experts"),
        (["grpo", "--num-generations", "1"], "--num-generations"),
        (["grpo", "--set", "reward=fancy"], "unknown reward"),
        (["grpo", "--model", "no-such-model"], "no-such-model"),
        (["rsim"], "needs a planner"),
        (["rsim", "--planner", "smollm2-135m", "--train", "both"], "unknown rsim.train"),
        (["rsim", "--planner", "http://localhost:1"], "cannot be reached"),
        # values no run can use
        (["grpo", "--lr", "inf"], "--learning-rate: learning_rate must be in (0, 1)"),
        (["grpo", "--temperature", "inf"], "--temperature: sampling.temperature must be a finite"),
        (["grpo", "--set", "beta=-1"], "beta must be a finite number >= 0"),
        (["grpo", "--set", "beta=.nan"], "beta must be a finite number >= 0"),
        (["grpo", "--set", "learning_rate=abc"], "config key 'learning_rate' must be float"),
        (["grpo", "--prompts-per-step", "100000000"], "--prompts-per-step: prompts_per_step"),
        (["grpo", "--num-generations", "100000"], "--num-generations: sampling.n must be"),
        (["grpo", "--report-to", "nowhere"], "--report-to: report_to 'nowhere' is not a tracker"),
        # what TRL refuses, before anything loads
        (["grpo", "--set", "trl.learning_rate=1e-3"], "trl.learning_rate is collab train's"),
        (["grpo", "--set", "trl.nonexistent=1"], "trl.nonexistent is not a TRL GRPOConfig"),
        (
            ["grpo", "--num-generations", "3", "--set", "trl.per_device_train_batch_size=4"],
            "must be divisible by num_generations (3)",
        ),
        # options and settings the method does not read
        (["grpo", "--teacher", "reference"], "No such option: --teacher"),
        (["grpo", "--set", "protocol.teacher=x"], "the solo protocol has no teacher"),
        (["relay", "--teacher", "reference", "--train", "planner"], "No such option: --train"),
        (
            ["relay", "--teacher", "reference", "--set", "rsim.train=planner"],
            "rsim.train is read by collab train rsim only, not relay",
        ),
        (["eapo", "--expert", "reference", "--set", "reward=simple"], "reward is read by"),
        (["relay", "--teacher", "reference", "-c", str(GRPO_CONFIG)], "config sets method grpo"),
        # collaborators that cannot serve, found before any model loads
        (["relay", "--teacher", "http://127.0.0.1:9/v1"], "cannot reach http://127.0.0.1:9/v1"),
        (
            [
                "eapo",
                "--expert",
                "no-such-expert",
                "--expert-max-tokens",
                "16",
                "--max-tokens",
                "256",
            ],
            "unknown model 'no-such-expert'",
        ),
        (["eapo", "--expert", "reference"], "cannot hold one consult turn of 1744 tokens"),
    ],
)
def test_bad_runs_are_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = collab("train", *args, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "run").exists()  # a refused run leaves no folder


def test_rsim_trains_and_names_its_planner(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = collab(
        "train", "rsim", "--model", str(tiny_model_dir), "--planner", str(tiny_model_dir),
        "--train", "planner", "--data", "arith_train", "--limit", "4", "--steps", "1",
        "--prompts-per-step", "2", "--num-generations", "2", "--max-tokens", "16",
        "--set", "protocol.strategy.max_steps=2", "--eval-data", "arith", "--eval-limit", "2",
        "--out", "run", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "planner reward" in result.stdout and "use it as --planner" in result.stdout
    assert (tmp_path / "run" / "planner" / "planner.json").is_file()
    # The trained reasoner is evaluated with the trained planner, greedy (temperature 0).
    evaluated = yaml.safe_load((tmp_path / "run" / "eval-final" / "config.yaml").read_text())
    strategy = evaluated["protocol"]["strategy"]
    assert evaluated["protocol"]["planner"] == "run/planner"  # the --out given, relative
    assert strategy["planner_temperature"] == 0.0 and strategy["max_steps"] == 2


def test_config_show_lists_the_grpo_fields() -> None:
    shown = subprocess.run(
        [str(COLLAB), "config", "show", "train-grpo"], capture_output=True, text=True, check=True
    ).stdout
    assert "sampling:" in shown and "schedule:" in shown and "reward:" in shown


def _grpo_args(model: Path, steps: int, *more: str) -> list[str]:
    return [
        "train", "grpo", "--model", str(model), "--data", "arith_train", "--limit", "8",
        "--steps", str(steps), "--prompts-per-step", "2", "--num-generations", "2",
        "--max-tokens", "8", "--set", "save_steps=1", "--out", "run", *more,
    ]  # fmt: skip


def test_a_run_killed_with_sigkill_resumes_from_its_last_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import os
    import signal
    import time

    run = tmp_path / "run"
    process = subprocess.Popen(
        [str(COLLAB), *_grpo_args(tiny_model_dir, 40)],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if (run / "checkpoints" / "checkpoint-2" / "trainer_state.json").exists():
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (run / "final").exists(), "the kill came after the run finished"

    fresh = collab(*_grpo_args(tiny_model_dir, 4), cwd=tmp_path)
    assert_one_line_error(fresh, "already holds checkpoints", "--resume")
    resumed = collab(*_grpo_args(tiny_model_dir, 4, "--resume"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in logged if "reward" in h] == [1, 2, 3, 4]  # none twice
    assert (run / "final" / "config.json").is_file()


# What a dry run, `config show` and the run refuse alike, before any work (issue 33): a
# reward function TRL cannot call, an engine that does not exist, LoRA targets the model
# lacks, a misspelt stand-in.
WRONG_SIGNATURE = "def two(prompts, completions):\n    return [0.0 for _ in completions]\n"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["grpo", "--reward-func", "builtins:len"], "builtins:len takes obj by position only"),
        # One CLI start (~5 s) each: those whose check is also tested in-process
        # (test_rewards, test_plan, test_config, test_reference) run with the slow tests.
        pytest.param(
            ["grpo", "--reward-func", "my_rewards:two"],
            "my_rewards:two takes no **kwargs",
            marks=pytest.mark.slow,
        ),
        (["grpo", "--set", "engine.kind=bogus"], "engine.kind must be one of auto, transformers"),
        pytest.param(
            ["grpo", "--set", "engine.timeout=-1"],
            "engine.timeout must be a finite number > 0",
            marks=pytest.mark.slow,
        ),
        (
            ["grpo", "--model", "{tiny}", "--lora", "--set", "lora.target_modules=[q_proj,bogus]"],
            "lora.target_modules: {tiny} has no module 'bogus' LoRA can adapt",
        ),
        pytest.param(
            ["grpo", "--lora", "--set", "lora.target_modules=[all-linear,q_proj]"],
            "lora.target_modules must be all-linear alone, or module names",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["relay", "--teacher", "Reference@0.5"],
            "the stand-in is written in lower case",
            marks=pytest.mark.slow,
        ),
    ],
)
# The run's side is slow-marked: both sides call one check (GRPOTrainConfig.check), and
# each case costs a CLI start (~5 s) that the dry run's side already pays.
@pytest.mark.parametrize(
    "dry_run", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["dry run", "run"]
)
def test_the_dry_run_refuses_what_the_run_refuses(
    args: list[str], fragment: str, dry_run: bool, tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "my_rewards.py").write_text(WRONG_SIGNATURE)
    args = [arg.format(tiny=tiny_model_dir) for arg in args]
    more = ["--dry-run"] if dry_run else []
    result = collab("train", *args, "--out", "run", *more, cwd=tmp_path)
    assert_one_line_error(result, fragment.format(tiny=tiny_model_dir))
    assert not (tmp_path / "run").exists()


def test_config_show_refuses_what_the_run_refuses(tmp_path: Path) -> None:
    shown = collab("config", "show", "train-grpo", "--set", "engine.kind=bogus", cwd=tmp_path)
    assert_one_line_error(shown, "engine.kind must be one of")


RAISES = "def fails(prompts, completions, **kwargs):\n    raise KeyError('score')\n"
NAN = "def nan(prompts, completions, **kwargs):\n    return [float('nan')] * len(completions)\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "spec", "fragment"),
    [
        (RAISES, "user_rewards:fails", "reward function user_rewards:fails raised KeyError"),
        (NAN, "user_rewards:nan", "reward function user_rewards:nan returned nan for completion"),
    ],
)
def test_a_reward_function_failing_in_a_run_is_one_line(
    source: str, spec: str, fragment: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "user_rewards.py").write_text(source)
    result = collab(*_grpo_args(tiny_model_dir, 1, "--reward-func", spec), cwd=tmp_path)
    # The model has loaded (its progress bars come first): the error is the last line.
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"error: {fragment}"), result.stderr
    assert not (tmp_path / "run").exists()  # failed before logging a step: nothing to keep
