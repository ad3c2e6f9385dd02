"""The loads the main process makes alone after training run outside DeepSpeed ZeRO-3
(issue 50): the LoRA merge and the `final_dtype` cast of `save_final` (train/run.py),
and the end-of-run evaluation (train/grpo.py), in process or, after a launch of several
processes, in a process of its own.

accelerate registers its DeepSpeed config with transformers for the whole process, and
while it is registered every `from_pretrained` enters `deepspeed.zero.Init`, whose
collectives the other processes never join: the main process would wait for ever. The
`zero3` fixture registers it as accelerate does where DeepSpeed is installed
(`DeepSpeedPlugin.set_deepspeed_weakref`, with `deepspeed.zero.Init` made to fail when
entered). Where it is not (this project does not require it), the same registration is
made with transformers' own `set_hf_deepspeed_config`, of a config that says ZeRO-3:
what transformers reads is the same, only the object differs, and entering zero.Init,
which begins with `import deepspeed`, fails with an ImportError."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collabrl.config import DecodingConfig
from collabrl.errors import UserError
from collabrl.train.final import save_final
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.launch import LAUNCH_VARIABLES, solo_environment
from collabrl.train.lora import LoraSettings
from collabrl.train.resolve import resolve_run

# The least DeepSpeed config of a ZeRO-3 launch, as accelerate builds it from zero3.yaml.
ZERO3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}


class EnteredZeroInit(AssertionError):
    """A model was built inside `deepspeed.zero.Init` by a process loading alone."""


def refuse_zero_init(*args: Any, **kwargs: Any) -> None:
    raise EnteredZeroInit("a load on one process entered deepspeed.zero.Init")


class ZeRO3Config:
    """What transformers reads of a registered DeepSpeed config: its stage and its dict."""

    config = ZERO3

    def is_zero3(self) -> bool:
        return True


@pytest.fixture
def zero3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Turns ZeRO-3 on for this process, as a launch would, when called; off after."""
    from transformers.integrations import deepspeed as hf_deepspeed

    kept: list[Any] = []  # transformers holds a weak reference only

    def turn_on() -> None:
        if importlib.util.find_spec("deepspeed") is not None:
            import deepspeed
            from accelerate.utils import DeepSpeedPlugin

            plugin = DeepSpeedPlugin(hf_ds_config=dict(ZERO3), zero3_init_flag=True)
            plugin.set_deepspeed_weakref()
            monkeypatch.setattr(deepspeed.zero, "Init", refuse_zero_init)
            kept.append(plugin)
        else:
            # Entering zero.Init starts with `import deepspeed`: refused, as not installed.
            monkeypatch.setitem(sys.modules, "deepspeed", None)
            kept.append(ZeRO3Config())
            hf_deepspeed.set_hf_deepspeed_config(kept[-1])
        assert hf_deepspeed.is_deepspeed_zero3_enabled()

    yield turn_on
    hf_deepspeed.unset_hf_deepspeed_config()


def zero3_on() -> bool:
    from transformers.integrations import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


def cpu_trainer(model: Any, tokenizer: Any, folder: Path) -> Any:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(str(folder), use_cpu=True, report_to=[])
    return Trainer(model=model, args=args, processing_class=tokenizer)


def test_the_lora_merge_loads_the_base_outside_zero3(
    tiny_model_dir: Path, tmp_path: Path, zero3: Callable[[], None]
) -> None:
    from peft import get_peft_model
    from safetensors.torch import load_file

    from collabrl.models import load_model, load_tokenizer

    lora = LoraSettings(True, r=4)
    model = get_peft_model(load_model(str(tiny_model_dir)), lora.peft_config())
    trainer = cpu_trainer(model, load_tokenizer(str(tiny_model_dir)), tmp_path / "checkpoints")
    zero3()  # the trainer is built: from here on, the process is in a ZeRO-3 launch
    save_final(trainer, tmp_path / "final", lora)
    merged = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert "model.norm.weight" in merged and not any("lora" in name for name in merged)
    assert zero3_on()  # registered again for the trainer, which still runs


def test_the_final_dtype_cast_loads_outside_zero3(
    tiny_model_dir: Path, tmp_path: Path, zero3: Callable[[], None]
) -> None:
    import torch
    from safetensors.torch import load_file

    from collabrl.models import load_model, load_tokenizer

    model = load_model(str(tiny_model_dir))
    trainer = cpu_trainer(model, load_tokenizer(str(tiny_model_dir)), tmp_path / "checkpoints")
    zero3()
    save_final(trainer, tmp_path / "final", None, "bfloat16")
    weights = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    assert zero3_on()


def held_out_run(model: Path, out: Path) -> tuple[GRPOTrainConfig, str | None]:
    """A finished run's folder (final/ is the starting model) and its config, with a
    held-out set of two problems, and the prompt the policy trained with."""
    from collabrl.data.benchmarks import Fields, load_benchmark
    from collabrl.train.resolve import resolve_run

    shutil.copytree(model, out / "final")
    config = GRPOTrainConfig(
        model=str(model),
        data="arith_train",
        out=str(out),
        eval_data="arith",
        eval_limit=2,
        sampling=DecodingConfig(n=2, max_tokens=4, temperature=1.0),
    )
    bench = load_benchmark(config.data, Fields.of(config), 2)
    return config, resolve_run(config).prompt(bench.prompt)


def test_the_end_of_run_evaluation_in_process_loads_outside_zero3(
    tiny_model_dir: Path, tmp_path: Path, zero3: Callable[[], None]
) -> None:
    """One process of a ZeRO-3 launch (a single GPU with offloading): the evaluation
    loads the starting and the trained policy on the transformers engine."""
    from collabrl.train.grpo import evaluate_run

    config, prompt = held_out_run(tiny_model_dir, tmp_path)
    zero3()
    results = evaluate_run(resolve_run(config), tmp_path, prompt)
    assert results["start"]["problems"] == results["final"]["problems"] == 2
    assert zero3_on()


# What torch's elastic agent and accelerate set in each process of `accelerate launch
# --config_file configs/accelerate/zero3.yaml` (and TRL's colocated vLLM, RANK and
# WORLD_SIZE again).
LAUNCH = {
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29511",
    "TORCHELASTIC_RUN_ID": "none",
    "ACCELERATE_USE_DEEPSPEED": "true",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": "none",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "false",
}


def test_a_process_started_alone_leaves_the_launch_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in LAUNCH.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    solo = solo_environment()
    assert not (set(LAUNCH) | LAUNCH_VARIABLES) & set(solo)
    assert solo["OMP_NUM_THREADS"] == "1" and solo["PATH"] == os.environ["PATH"]


class Children:
    """`subprocess.Popen`, recording each process it starts (they run as they would)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: list[subprocess.Popen] = []
        self.envs: list[dict[str, str]] = []
        real = subprocess.Popen

        def popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
            child = real(*args, **kwargs)
            self.started.append(child)
            self.envs.append(kwargs.get("env") or dict(os.environ))
            return child

        monkeypatch.setattr(subprocess, "Popen", popen)


def test_after_a_launch_the_evaluation_runs_in_a_process_of_its_own(
    tiny_model_dir: Path, tmp_path: Path, zero3: Callable[[], None], monkeypatch
) -> None:
    """Rank 0 of a two-process ZeRO-3 launch, its trainer gone: the evaluation runs in a
    child without the launch's variables, whose progress and lines come back here."""
    from collabrl.train.grpo import evaluate_apart

    config, prompt = held_out_run(tiny_model_dir, tmp_path)
    for name, value in LAUNCH.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["collab", "train", "grpo", "--eval-data", "arith"])
    zero3()
    children = Children(monkeypatch)
    lines: list[str] = []
    steps: list[tuple[int, int]] = []
    results = evaluate_apart(
        resolve_run(config), tmp_path, prompt, lambda d, t: steps.append((d, t)), lines.append
    )
    assert results["start"]["problems"] == results["final"]["problems"] == 2
    assert set(results["paired"]) == {"gained", "lost", "p_value"}
    assert len(children.started) == 1 and not set(LAUNCH) & set(children.envs[0])
    assert lines == [
        "held-out arith: evaluating the start policy",
        "held-out arith: evaluating the final policy",
    ]
    assert steps and steps[-1][0] == steps[-1][1]  # the bar reached its end
    # The folders record the run's command, as an evaluation in process did.
    header = (tmp_path / "eval-final" / "config.yaml").read_text()
    assert "# command: collab train grpo --eval-data arith" in header


def test_a_failed_evaluation_apart_is_one_line_naming_the_command_that_resumes_it(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """The child's one-line error comes back as it is; a child killed outright (the
    system's out-of-memory killer) gives one line too, with the commands to run."""
    from collabrl.train.grpo import evaluate_apart

    config, prompt = held_out_run(tiny_model_dir, tmp_path)
    (tmp_path / "final" / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(UserError) as failed:
        evaluate_apart(resolve_run(config), tmp_path, prompt)
    message = str(failed.value)
    assert "\n" not in message and "model.safetensors" in message
    assert "collab eval arith -c " in message
    assert json.loads((tmp_path / "eval.json").read_text()).keys() == {"start"}

    shutil.rmtree(tmp_path / "final")
    shutil.copytree(tiny_model_dir, tmp_path / "final")
    shutil.rmtree(tmp_path / "eval-start")
    children = Children(monkeypatch)

    def kill_the_child(done: int, total: int) -> None:
        children.started[-1].send_signal(signal.SIGKILL)

    with pytest.raises(UserError) as killed:
        evaluate_apart(resolve_run(config), tmp_path, prompt, kill_the_child)
    message = str(killed.value)
    assert "\n" not in message and f"exit code -{int(signal.SIGKILL)}" in message
    assert message.count("collab eval arith -c ") == 2  # start and final, resumable
