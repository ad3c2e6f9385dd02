"""Every shipped paper config runs in miniature (tests/configs/miniature.py): the same
structure on a tiny model, two CPU processes. A structural mistake (a hang, a group
split wrongly over processes, a merge, a budget that cannot hold a turn) fails here
before a GPU run meets it.

The fast tests check that each paper config has a miniature that keeps its structure;
the slow ones run them under `accelerate launch` (configs/accelerate/cpu-2proc.yaml),
each with a timeout so that a hang fails instead of blocking the suite.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from collabrl.cli.options import load_config
from collabrl.engines import is_url
from collabrl.engines.reference import is_stand_in
from collabrl.train.grpo_args import grpo_args
from collabrl.train.grpo_config import changed_keys
from collabrl.train.methods import registry as methods
from tests.configs.miniature import (
    GROUP,
    MAX_TOKENS,
    PAPER_CONFIGS,
    TOKEN_KEYS,
    command_of,
    miniature,
)
from tests.launch import launch_two

GRPO_PAPER_CONFIGS = [p for p in PAPER_CONFIGS if command_of(p) != "train-sft"]
SFT_PAPER_CONFIGS = [p for p in PAPER_CONFIGS if command_of(p) == "train-sft"]
# What a miniature may change: its scale, never its structure.
SCALE_KEYS = {
    *(".model", ".data", ".limit", ".steps", ".prompts_per_step", ".save_steps"),
    *(".sampling.n", ".sampling.max_tokens", ".eval_data", ".eval_limit", ".eval_steps"),
    *(".protocol.teacher", ".protocol.experts", ".protocol.planner"),
    *(f".protocol.{block}.{key}" for block, key in TOKEN_KEYS.items()),
    ".trl",  # its keys are compared as TRL reads them, below
}
SCALE_TRL_ARGS = {
    *("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation"),
    *("generation_batch_size", "max_steps", "save_steps", "num_generations"),
    *("max_completion_length", "use_vllm", "output_dir"),
}
SFT_SCALE_KEYS = {".model", ".batch_size", ".gradient_accumulation_steps", ".max_length"}
SFT_SCALE_KEYS |= {".save_steps"}
# Seconds a miniature may take on two shared cores before it counts as hung; a run
# takes one to three minutes.
TIMEOUT = 600
SFT_ROWS = 16


def _write(config: dict[str, Any], folder: Path) -> Path:
    path = folder / "miniature.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _loaded(path: Path, config_path: Path) -> Any:
    # An SFT config leaves --data to the command line (the rows of a build).
    given = {"data": "rows.jsonl"} if command_of(path) == "train-sft" else {}
    return load_config(command_of(path), config_path, given, [])


def _shipped_and_miniature(path: Path, model: Path, folder: Path) -> tuple[Any, Any]:
    """The shipped config at `path` and its miniature on `model`, both resolved."""
    return _loaded(path, path), _loaded(path, _write(miniature(path, model), folder))


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.name)
def test_every_paper_config_has_a_miniature_that_passes_its_checks(
    path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = _loaded(path, _write(miniature(path, tiny_model_dir), tmp_path))
    config.check()
    if command_of(path) == "train-sft":
        return
    protocol = config.protocol
    collaborators = [protocol.teacher, *protocol.experts, protocol.planner]
    for ref in filter(None, collaborators):  # nothing to serve, nothing to download
        assert not is_url(ref) and (is_stand_in(ref) or ref == str(tiny_model_dir)), ref


@pytest.mark.parametrize("path", GRPO_PAPER_CONFIGS, ids=lambda p: p.name)
def test_a_miniature_keeps_its_paper_configs_structure(
    path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    shipped, mini = _shipped_and_miniature(path, tiny_model_dir, tmp_path)
    assert set(changed_keys(mini, shipped, "")) <= SCALE_KEYS
    paper, small = grpo_args(shipped, tmp_path), grpo_args(mini, tmp_path)
    # Every other TRL argument as TRL reads it: loss type, clip, β, num_iterations,
    # checkpointing, the schedule (vLLM's, unread without it, aside).
    names = {f.name for f in dataclasses.fields(paper) if not f.name.startswith("vllm_")}
    for name in names - SCALE_TRL_ARGS:
        assert getattr(small, name) == getattr(paper, name), name
    # The batch's shape: updates per generation, accumulation, groups over micro-batches.
    assert _updates(small) == _updates(paper) and small.num_iterations == paper.num_iterations
    assert (small.gradient_accumulation_steps > 1) == (paper.gradient_accumulation_steps > 1)
    micro, group = paper.per_device_train_batch_size, paper.num_generations
    small_micro = small.per_device_train_batch_size
    assert (small_micro < GROUP) == (micro < group)  # a group spans micro-batches
    assert (small_micro % GROUP == 0) == (micro % group == 0)  # or they hold whole groups
    assert small.max_steps == 2 * _updates(paper)  # two generations
    # Token budgets keep their ratio to the episode's (EAPO: K answers against it).
    block = methods.get(shipped.method).protocol
    if block in TOKEN_KEYS:
        ratio = getattr(getattr(shipped.protocol, block), TOKEN_KEYS[block]) / (
            shipped.sampling.max_tokens
        )
        small_ratio = getattr(getattr(mini.protocol, block), TOKEN_KEYS[block]) / MAX_TOKENS
        assert ratio <= small_ratio <= ratio + 1 / MAX_TOKENS
    # RelayLLM's authors validate every step (EasyR1 trainer.val_freq 1).
    assert (mini.eval_steps == 1) == (shipped.method == "relay" or shipped.eval_steps is not None)


@pytest.mark.parametrize("path", SFT_PAPER_CONFIGS, ids=lambda p: p.name)
def test_an_sft_miniature_keeps_its_paper_configs_structure(
    path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    shipped, mini = _shipped_and_miniature(path, tiny_model_dir, tmp_path)
    assert set(changed_keys(mini, shipped, "")) <= SFT_SCALE_KEYS
    assert (mini.gradient_accumulation_steps > 1) == (shipped.gradient_accumulation_steps > 1)


def _updates(args: Any) -> int:
    """Optimizer updates a generation is trained in."""
    return (args.steps_per_generation or args.gradient_accumulation_steps) // (
        args.gradient_accumulation_steps
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", GRPO_PAPER_CONFIGS, ids=lambda p: p.name)
def test_a_paper_config_runs_in_miniature_on_two_processes(
    path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = miniature(path, tiny_model_dir)
    method = config["method"]
    args = ["train", method, "-c", str(_write(config, tmp_path)), "--out", "run"]
    done = launch_two(["-m", "collabrl", *args], tmp_path, TIMEOUT)
    assert done.returncode == 0, done.stderr[-4000:]
    run = tmp_path / "run"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    steps, updates = config["steps"], config["steps"] // 2
    assert [h["step"] for h in logged if "loss" in h] == list(range(1, steps + 1))
    # TRL logs the rollout's metrics once per generation: two, `updates` steps apart.
    assert [h["step"] for h in logged if "reward" in h] == [1, 1 + updates]
    if config.get("eval_steps"):
        evaluated = sorted(h["step"] for h in logged if "eval/pass@1" in h)
        assert evaluated == list(range(1, steps + 1))
    assert json.loads((run / "eval.json").read_text()).keys() >= {"start", "final"}
    assert (run / "checkpoints" / f"checkpoint-{steps}").is_dir()
    assert (run / "final").is_dir()
    if method == "rsim":
        assert (run / "planner" / "planner.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("path", SFT_PAPER_CONFIGS, ids=lambda p: p.name)
def test_a_warmup_config_runs_in_miniature_on_two_processes(
    path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    completion = "8 + 6 is<call>20</call> 14. \\boxed{14}"
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is 8 + {i}?"}],
            "completion": [{"role": "assistant", "content": completion}],
            "item_id": f"a{i}",
            "sample": 0,
        }
        for i in range(SFT_ROWS)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = _write(miniature(path, tiny_model_dir), tmp_path)
    args = ["train", "sft", "-c", str(config), "--data", "rows.jsonl", "--out", "run"]
    done = launch_two(["-m", "collabrl", *args], tmp_path, TIMEOUT)
    assert done.returncode == 0, done.stderr[-4000:]
    # 16 rows, 2 per process and micro-batch, 2 accumulated, 2 processes: 2 updates.
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert max(h.get("step", 0) for h in logged) == 2
    assert (tmp_path / "run" / "final" / "config.json").is_file()
