"""A LoRA run under `accelerate launch` with DeepSpeed ZeRO-3 on two CPU processes
(gloo), to its end: the adapter merged into final/, cast to `final_dtype`, and the
end-of-run evaluation of the start and the trained policy (issue 50). Those loads are
the main process's alone; under ZeRO-3's registration they entered `deepspeed.zero.Init`
and waited in its collectives for the other process, which had finished.

On a CPU accelerate registers DeepSpeed's ZeRO-3 config with transformers as on GPUs
(every `from_pretrained` of the launch enters `zero.Init`), but trains with DDP over
gloo: DeepSpeed's engine, and its gathered 16-bit save, run on GPUs only
(scripts/gpu-check.sh runs them on two). Needs the `deepspeed` package."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest

from tests.launch import launch_two

# accelerate's own options, after cpu-2proc.yaml: they make the launch a ZeRO-3 one.
ZERO3 = ["--use_deepspeed", "--zero_stage", "3", "--zero3_init_flag", "true"]


def safetensors_header(path: Path) -> dict:
    """The tensor names and dtypes of a safetensors file, read from its header."""
    with path.open("rb") as file:
        length = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(length))
    header.pop("__metadata__", None)
    return header


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed (pip install deepspeed)"
)
def test_a_zero3_lora_run_merges_casts_and_evaluates_on_two_processes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = [
        *ZERO3, "-m", "collabrl", "train", "grpo",
        "--model", str(tiny_model_dir), "--data", "arith_train", "--limit", "8",
        "--steps", "1", "--prompts-per-step", "2", "--num-generations", "2",
        "--max-tokens", "8", "--lora", "--set", "final_dtype=bfloat16",
        "--eval-data", "arith", "--eval-limit", "2", "--out", "run",
    ]  # fmt: skip
    done = launch_two(args, tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    header = safetensors_header(tmp_path / "run" / "final" / "model.safetensors")
    assert {tensor["dtype"] for tensor in header.values()} == {"BF16"}
    assert "model.norm.weight" in header and not any("lora" in name for name in header)
    evaluation = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert evaluation.keys() == {"start", "final", "paired"}
    assert done.stdout.count("evaluating the final policy") == 1
