"""What the shipped training configs actually set: each GRPO config in configs/train/ is
loaded as `collab train` loads it, checked, and resolved into TRL's GRPOConfig, and the
effective values are read off that object — the attributes the trainers read, not the
yaml. (tests/configs/ only checks that every config loads.)

GRPOConfig builds on a CPU with `use_vllm: true` (TRL looks for vLLM only when the
trainer starts); it would refuse bf16 without `use_cpu`, which `grpo_args` sets here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from collabrl.cli.options import load_config
from collabrl.config import read_yaml
from collabrl.protocols.consult_config import check_turn_fits
from collabrl.train.grpo_args import check_run, grpo_args
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.methods import registry as methods

TRAIN_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "train"
GRPO_CONFIGS = sorted(p for p in TRAIN_CONFIGS.glob("*.yaml") if not p.name.startswith("sft-"))
SFT_CONFIGS = sorted(TRAIN_CONFIGS.glob("sft-*.yaml"))

# The paper configs that split a generation into several optimizer steps: (GPUs they
# are laid out for, prompts per optimizer step, prompts per generation), from EAPO
# Table 4 (train batch 32, generation batch 96) and RelayLLM Table 7 with the authors'
# EasyR1 config (update batch 32, rollout batch 128).
MINI_BATCHED = {
    "eapo-r1-distill-7b.yaml": (8, 32, 96),
    "relay-qwen3-1.7b.yaml": (8, 32, 128),
}


def _resolved(path: Path, tmp_path: Path) -> tuple[GRPOTrainConfig, Any]:
    method = yaml.safe_load(path.read_text())["method"]  # the command the config is for
    config = load_config(f"train-{method}", path, {}, [])
    check_run(config)
    return config, grpo_args(config, tmp_path)


def _checkpointing_in(trl: dict[str, Any]) -> bool:
    return bool(trl.get("activation_checkpointing", trl.get("gradient_checkpointing", False)))


def test_every_train_config_is_a_grpo_or_an_sft_config() -> None:
    for path in GRPO_CONFIGS:
        assert read_yaml(path)["method"] in methods.grpo_names(), path.name
    assert len(GRPO_CONFIGS) + len(SFT_CONFIGS) == len(list(TRAIN_CONFIGS.glob("*.yaml")))


@pytest.mark.parametrize("path", GRPO_CONFIGS, ids=lambda p: p.name)
def test_checkpointing_is_on_exactly_where_the_config_says(path: Path, tmp_path) -> None:
    _, args = _resolved(path, tmp_path)
    wanted = _checkpointing_in(read_yaml(path).get("trl", {}))
    # transformers' Trainer enables it from `activation_checkpointing` (5.20 on), TRL
    # reads the mirrored `gradient_checkpointing`: both must agree with the yaml.
    assert getattr(args, "activation_checkpointing", args.gradient_checkpointing) is wanted
    assert args.gradient_checkpointing is wanted


def test_the_paper_configs_turn_checkpointing_on(tmp_path) -> None:
    for name in MINI_BATCHED:
        _, args = _resolved(TRAIN_CONFIGS / name, tmp_path)
        assert args.gradient_checkpointing is True, name


@pytest.mark.parametrize("path", GRPO_CONFIGS, ids=lambda p: p.name)
def test_vllm_episodes_are_corrected_per_token(path: Path, tmp_path) -> None:
    _, args = _resolved(path, tmp_path)
    assert args.vllm_importance_sampling_correction is True
    assert args.vllm_importance_sampling_mode == "token_truncate"
    assert args.vllm_importance_sampling_clip_max == 3.0  # TRL's cap, kept


@pytest.mark.parametrize("path", GRPO_CONFIGS, ids=lambda p: p.name)
def test_no_bf16_on_a_cpu(path: Path, tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the CPU settings")
    _, args = _resolved(path, tmp_path)
    assert args.bf16 is False and args.use_cpu is True


@pytest.mark.parametrize("name", sorted(MINI_BATCHED))
def test_a_paper_generation_is_trained_in_several_optimizer_steps(name: str, tmp_path) -> None:
    config, args = _resolved(TRAIN_CONFIGS / name, tmp_path)
    gpus, update_prompts, generation_prompts = MINI_BATCHED[name]
    group = config.sampling.n
    micro, accumulated = args.per_device_train_batch_size, args.gradient_accumulation_steps
    assert args.num_iterations == 1
    assert micro * accumulated == config.prompts_per_step * group  # prompts_per_step holds
    assert micro * accumulated * gpus == update_prompts * group
    assert micro * args.steps_per_generation * gpus == generation_prompts * group
    updates = args.steps_per_generation // accumulated
    assert args.steps_per_generation % accumulated == 0
    assert updates == generation_prompts // update_prompts > 1


def test_eapo_trains_with_dapos_clip_and_samples_its_experts_as_qwq_asks(tmp_path) -> None:
    config, args = _resolved(TRAIN_CONFIGS / "eapo-r1-distill-7b.yaml", tmp_path)
    assert (args.epsilon, args.epsilon_high) == (0.2, 0.28)
    consult = config.protocol.consult
    assert (consult.expert_temperature, consult.expert_top_p) == (0.6, 0.95)
    # One full turn of K answers fits the episode (issue 32: 3 × 8192 did not).
    check_turn_fits(consult, config.sampling.max_tokens)
    assert consult.expert_max_tokens >= 4096  # room for QwQ's thinking
    assert args.max_completion_length == 20480 and args.warmup_steps == 10
    assert args.lr_scheduler_type == "constant_with_warmup"  # Table 4: warm up, then 1e-6


def test_relay_keeps_table_7(tmp_path) -> None:
    _, args = _resolved(TRAIN_CONFIGS / "relay-qwen3-1.7b.yaml", tmp_path)
    assert (args.learning_rate, args.weight_decay, args.beta) == (1e-6, 0.01, 0.01)
    assert (args.num_generations, args.max_completion_length) == (8, 8192)
    assert args.lr_scheduler_type == "constant"
    # The clip of the authors' EasyR1 actor: clip_ratio_low/high 0.2/0.3, dual clip 3.
    assert (args.epsilon, args.epsilon_high, args.delta) == (0.2, 0.3, 3.0)
    assert (args.loss_type, args.top_p) == ("dapo", 1.0)  # loss_avg_mode token; rollout top_p


def test_rsim_paper_config_follows_section_5(tmp_path) -> None:
    config, args = _resolved(TRAIN_CONFIGS / "rsim-qwen2.5-0.5b.yaml", tmp_path)
    assert config.method == "rsim" and config.data == "math_train"
    # 16 samples (one group) per micro-batch, 4 accumulated, one update per generation.
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, 4)
    assert args.steps_per_generation == 4
    assert (args.num_generations, args.temperature, args.beta) == (16, 0.9, 0.04)
    assert (args.learning_rate, args.max_completion_length) == (2e-5, 1024)
    assert args.lr_scheduler_type == "cosine"
    strategy = config.protocol.strategy
    assert (strategy.planner_temperature, strategy.end) == (0.9, "terminal")
    assert (config.rsim.lambda_first, config.rsim.lambda_after) == (0.7, 0.3)


@pytest.mark.parametrize("path", SFT_CONFIGS, ids=lambda p: p.name)
def test_sft_configs_checkpoint_as_they_say(path: Path, tmp_path) -> None:
    from collabrl.train.sft import sft_args

    # The SFT configs leave --data to the command line (the rows of a build).
    config = load_config("train-sft", path, {"data": "runs/warmup-relay"}, [])
    config.check()
    args = sft_args(config, tmp_path)
    wanted = bool(read_yaml(path)["activation_checkpointing"])
    assert args.gradient_checkpointing is wanted
    assert getattr(args, "activation_checkpointing", wanted) is wanted


@pytest.mark.parametrize(
    "trl", [{"gradient_checkpointing": True}, {"activation_checkpointing": True}]
)
def test_an_sft_trl_block_turns_checkpointing_on_under_either_name(trl, tmp_path) -> None:
    from collabrl.train.sft import sft_args

    layer = {"data": "runs/warmup-relay", "activation_checkpointing": False, "trl": trl}
    config = load_config("train-sft", None, layer, [])
    args = sft_args(config, tmp_path)
    assert args.gradient_checkpointing is True
    assert getattr(args, "activation_checkpointing", True) is True
