"""`collab train METHOD --dry-run`: every shipped config resolves without loading a
weight, the memory arithmetic by hand, and bad settings refused with one line."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collabrl.cli.main import app
from collabrl.config import build_config, read_yaml
from collabrl.errors import UserError
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.plan import (
    GIB,
    ModelShape,
    estimate_memory,
    plan_run,
    shape_from_config,
    shape_from_name,
)

CONFIGS = Path(__file__).parents[2] / "configs" / "train"
GRPO_CONFIGS = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("sft-"))


def _load(path: Path, **changes) -> GRPOTrainConfig:
    return build_config(GRPOTrainConfig, [read_yaml(path), changes])


def _rows(plan) -> dict[str, str]:
    return {key: value for rows in plan.sections.values() for key, value in rows}


@pytest.mark.parametrize("path", GRPO_CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_resolves_without_loading_a_weight(path: Path, monkeypatch) -> None:
    import collabrl.models

    def no_weights(*args, **kwargs):
        raise AssertionError("a dry run loaded a model")

    monkeypatch.setattr(collabrl.models, "load_model", no_weights)
    plan = plan_run(_load(path))
    rows = _rows(plan)
    sections = {"run", "TRL (effective)", "batch (completions)", "who runs where"}
    assert sections | {"memory per device (estimate)"} <= set(plan.sections)
    assert rows["method"] == path.stem.split("-")[0]


def test_the_relay_paper_config_shows_its_effective_settings() -> None:
    rows = _rows(plan_run(_load(CONFIGS / "relay-qwen3-1.7b.yaml")))
    assert rows["gradient checkpointing"] == "True"
    assert rows["use_vllm"] == "True" and rows["vllm_mode"] == "colocate"
    assert rows["chat template options"] == "{'enable_thinking': False}"
    assert rows["teacher"] == "server at http://127.0.0.1:8001/v1 (not contacted)"
    assert rows["parameters"] == "1.72 B (from the shipped shape shapes/Qwen3-1.7B)"


def test_the_cli_dry_run_prints_the_plan_and_trains_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["train", "eapo", "-c", str(CONFIGS / "eapo-r1-distill-7b.yaml"), "--out", str(out)]
        + ["--dry-run"],
    )
    assert result.exit_code == 0, result.output
    assert "TRL (effective)" in result.output and "memory per device" in result.output
    assert "dry run: nothing was loaded or trained" in result.output
    assert not out.exists()  # no run folder


def test_an_inconsistent_setting_is_one_line(tmp_path: Path) -> None:
    command = ["train", "grpo", "--num-generations", "3", "--prompts-per-step", "1"]
    command += ["--set", "trl.generation_batch_size=4", "--dry-run", "--out", str(tmp_path)]
    result = subprocess.run(
        [sys.executable, "-m", "collabrl", *command], capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0
    assert "invalid TRL settings: generation_batch_size (4)" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_dry_run_opens_the_data_as_the_run_would(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"q": "What is 1 + 1?", "a": "2"}\n{"q": "What is 2 + 2?", "a": "4"}\n')
    config = _load(CONFIGS / "grpo-cpu-arith.yaml", data=str(data), eval_data="arith")
    with pytest.raises(UserError, match="rows.jsonl:1 has no 'problem' column"):
        plan_run(config)
    named = dataclasses.replace(config, problem_field="q", answer_field="a", eval_limit=18)
    rows = _rows(plan_run(named))
    assert rows["problems"] == "2" and rows["held-out"] == "18 (arith)"
    elsewhere = _load(CONFIGS / "grpo-cpu-arith.yaml", data="/cluster/data.jsonl")
    assert "problems '/cluster/data.jsonl' is not on this machine" in plan_run(elsewhere).warnings


def test_sizes_are_read_off_a_models_name() -> None:
    assert shape_from_name("runs/sft-relay-qwen3-1.7b/final").parameters == 1_700_000_000
    assert shape_from_name("./DeepSeek-R1-Distill-Qwen-7B").parameters == 7_000_000_000
    assert shape_from_name("smollm2-135m") is None  # millions are not billions
    assert shape_from_name("./my-model") is None


def test_a_config_json_is_counted_on_the_meta_device(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    shape = shape_from_config(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert (shape.hidden_size, shape.layers) == (64, 2)


def test_the_memory_arithmetic_by_hand() -> None:
    shape = ModelShape(parameters=GIB, hidden_size=1000, layers=10, vocab_size=500)
    alone = estimate_memory(
        shape,
        micro_batch=2,
        sequence=100,
        checkpointing=False,
        world_size=8,
        zero_stage=0,
        vllm_fraction=None,
    )
    assert (alone.weights, alone.gradients, alone.optimizer) == (4, 4, 8)  # 16 B/param
    # 4 MLP-wide tensors (4 × 1000 without an intermediate size) and 10 hidden-wide in
    # bf16, the norms' 4 in fp32 (2 bytes more each): (10 + 16) × 2 + 4 × 2 = 60 bytes.
    assert alone.activations == pytest.approx(2 * 100 * 1000 * 10 * 60 / GIB)
    # One bf16 tile of TRL's head (200 tokens × the vocabulary of 500), and the fp32
    # gradients of the head's weight and the hidden states.
    assert alone.logits == pytest.approx((200 * 500 * 2 + (500 + 200) * 1000 * 4) / GIB)
    zero3 = estimate_memory(
        shape,
        micro_batch=2,
        sequence=100,
        checkpointing=True,
        world_size=8,
        zero_stage=3,
        vllm_fraction=0.3,
    )
    assert (zero3.weights, zero3.gradients, zero3.optimizer) == (0.5, 0.5, 1.0)
    # One hidden state per layer (bf16 under DeepSpeed), and the layer being recomputed.
    expected = 2 * 100 * 1000 * (10 * 2 + 60) / GIB
    assert zero3.activations == pytest.approx(expected)
    zero1 = estimate_memory(
        shape,
        micro_batch=1,
        sequence=1,
        checkpointing=True,
        world_size=4,
        zero_stage=1,
        vllm_fraction=None,
    )
    assert (zero1.weights, zero1.gradients, zero1.optimizer) == (4, 4, 2)


def test_the_launch_comes_from_the_accelerate_config(tmp_path: Path) -> None:
    config = _load(CONFIGS / "eapo-r1-distill-7b.yaml")
    zero3 = Path(__file__).parents[2] / "configs" / "accelerate" / "zero3.yaml"
    rows = _rows(plan_run(config, zero3))
    assert rows["processes"] == f"8 ({zero3})" and rows["ZeRO stage"] == "3"
    # R1-Distill-Qwen-7B's shipped shape, 7.62e9 params × 16 B / 8 processes.
    state = rows["weights + gradients + AdamW (16 B a parameter)"]
    assert state == f"{7_615_616_512 * 16 / 8 / GIB:.1f} GiB"
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_processes: eight\n")
    with pytest.raises(UserError, match="num_processes must be a positive integer"):
        plan_run(config, bad)


def test_rsim_counts_the_planner_it_trains() -> None:
    config = _load(CONFIGS / "rsim-qwen2.5-0.5b.yaml")
    rows = _rows(plan_run(config))
    assert rows["planner"].endswith("trained beside the policy in every process (float32, DDP)")
    state = 494_032_768 * 16 / GIB  # Qwen2.5-0.5B's shipped shape, 16 bytes a parameter
    assert rows["planner weights + gradients + AdamW"] == f"{state:.1f} GiB"
    assert float(rows["training total"].split()[0]) > 2 * state  # and the activations
