"""The policy is loaded in the dtype training holds it in (issue 50): bf16 under DeepSpeed
with TRL's bf16, which casts the model and keeps the fp32 master weights in its
optimizer, instead of float32 on every process's CPU first (7B: 30 GB a process, 8
processes); float32 elsewhere, where the model holds the master weights itself.

The DeepSpeed launch is TRL's own arguments with the `deepspeed_plugin` an accelerate
launch gives them: transformers builds that plugin only where the deepspeed package is
installed, which this project does not require, so it is attached here as accelerate's
real `DeepSpeedPlugin`."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl.models import load_model
from collabrl.train.grpo_args import grpo_args, policy_dtype
from collabrl.train.grpo_config import GRPOTrainConfig


def _args(tiny_model_dir: Path, tmp_path: Path):
    config = GRPOTrainConfig(model=str(tiny_model_dir), data="arith_train", limit=2)
    return grpo_args(config, tmp_path)


def _under_deepspeed(args, *, bf16: bool, fp16: bool = False):
    from accelerate.utils import DeepSpeedPlugin

    ds = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}
    args.deepspeed_plugin = DeepSpeedPlugin(hf_ds_config=ds)
    args.bf16, args.fp16 = bf16, fp16
    return args


def _dtypes(model) -> set[str]:
    return {str(p.dtype).removeprefix("torch.") for p in model.parameters()}


def test_a_run_without_deepspeed_loads_float32_master_weights(tiny_model_dir, tmp_path) -> None:
    args = _args(tiny_model_dir, tmp_path)
    assert args.deepspeed_plugin is None
    dtype = policy_dtype(args)
    assert dtype == "float32"
    assert _dtypes(load_model(str(tiny_model_dir), dtype=dtype)) == {"float32"}


@pytest.mark.parametrize(
    ("bf16", "fp16", "expected"),
    [(True, False, "bfloat16"), (False, True, "float16"), (False, False, "float32")],
)
def test_under_deepspeed_the_policy_loads_in_its_training_dtype(
    tiny_model_dir, tmp_path, bf16, fp16, expected
) -> None:
    args = _under_deepspeed(_args(tiny_model_dir, tmp_path), bf16=bf16, fp16=fp16)
    assert policy_dtype(args) == expected
    model = load_model(str(tiny_model_dir), dtype=policy_dtype(args), device="cpu")
    assert _dtypes(model) == {expected}
