"""What TRL and vLLM are given of a run's lengths and epochs (issue 32): the prompt limit
(problems whose rendered prompt is longer are dropped, with a count), the colocated
vLLM's length (prompt + episode, not the model's 131,072), `steps: 0` as one epoch of
the kept problems, pinned for a resume; and where the dry run sees the trainer and a
local server on the same GPUs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from collabrl import runs
from collabrl.config import DecodingConfig, build_config, read_yaml, save_config
from collabrl.data.benchmarks import Fields, load_benchmark
from collabrl.errors import UserError
from collabrl.protocols.apollo import ApolloConfig
from collabrl.protocols.config import ProtocolConfig
from collabrl.train.grpo import train_grpo
from collabrl.train.grpo_args import grpo_args, pin_steps
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.plan import plan_run
from collabrl.train.prompt_length import prompt_lengths
from collabrl.train.resolve import resolve_run

CONFIGS = Path(__file__).parents[2] / "configs"
COLOCATED = {"use_vllm": True, "vllm_mode": "colocate"}


def _paper(name: str, **changes) -> GRPOTrainConfig:
    return build_config(GRPOTrainConfig, [read_yaml(CONFIGS / "train" / name), changes])


def _tiny(model: Path, **changes) -> GRPOTrainConfig:
    fields = {
        "model": str(model),
        "data": "arith_train",
        "limit": 4,
        "prompts_per_step": 1,
        "sampling": DecodingConfig(n=2, max_tokens=8, temperature=1.0),
        "save_steps": 1,
    }
    return GRPOTrainConfig(**(fields | changes))


def _rows(plan) -> dict[str, str]:
    return {key: value for rows in plan.sections.values() for key, value in rows}


# -- the colocated vLLM's length ---------------------------------------------------------


def test_the_colocated_vllm_holds_the_prompt_limit_and_the_episode(tmp_path: Path) -> None:
    config = _paper("eapo-r1-distill-7b.yaml", max_prompt_tokens=2048)
    assert grpo_args(config, tmp_path).vllm_max_model_length == 2048 + 20480
    # Without a limit, the longest prompt of the data (counted when the run starts).
    unlimited = _paper("eapo-r1-distill-7b.yaml", max_prompt_tokens=None)
    assert grpo_args(unlimited, tmp_path, 300).vllm_max_model_length == 300 + 20480
    # The trl block decides where it says; a vLLM server is sized by its own command.
    trl = {**unlimited.trl, "vllm_max_model_length": 4096}
    assert grpo_args(dataclasses.replace(config, trl=trl), tmp_path).vllm_max_model_length == 4096
    server = dataclasses.replace(config, trl={**config.trl, "vllm_mode": "server"})
    assert grpo_args(server, tmp_path).vllm_max_model_length is None


def test_the_dry_run_shows_the_vllm_length_trl_is_given() -> None:
    rows = _rows(plan_run(resolve_run(_paper("eapo-r1-distill-7b.yaml", max_prompt_tokens=2048))))
    assert rows["vllm_max_model_length"] == str(2048 + 20480)
    assert rows["max prompt tokens"] == "2048"
    # The policy's tokenizer is on the cluster only: sized when the run starts.
    rows = _rows(plan_run(resolve_run(_paper("eapo-r1-distill-7b.yaml", max_prompt_tokens=None))))
    assert rows["vllm_max_model_length"] == "the longest prompt + 20480 (counted at start)"
    server = _paper("eapo-r1-distill-7b.yaml", max_prompt_tokens=2048)
    server.trl["vllm_mode"] = "server"
    rows = _rows(plan_run(resolve_run(server)))
    assert rows["vllm_max_model_length"] == "trl vllm-serve --max-model-len (2048 + 20480)"


# -- the prompt limit ----------------------------------------------------------------------


def test_the_dry_run_counts_the_problems_the_prompt_limit_keeps(tiny_model_dir: Path) -> None:
    config = _tiny(tiny_model_dir, trl=COLOCATED)
    lengths = prompt_lengths(resolve_run(config), load_benchmark("arith_train", limit=4))
    limit = sorted(lengths)[1]
    kept = sum(n <= limit for n in lengths)
    assert 0 < kept < 4  # the limit drops some and keeps some
    rows = _rows(plan_run(resolve_run(dataclasses.replace(config, max_prompt_tokens=limit))))
    assert rows["problems"] == f"{kept} of 4 ({4 - kept} dropped)"
    assert rows["longest prompt"] == f"{max(lengths)} tokens"
    assert rows["vllm_max_model_length"] == str(limit + 8)
    # No limit: the colocated vLLM is sized to the longest prompt the data has.
    assert _rows(plan_run(resolve_run(config)))["vllm_max_model_length"] == str(max(lengths) + 8)


def test_a_limit_no_problem_fits_is_refused_with_one_line(tiny_model_dir: Path) -> None:
    with pytest.raises(UserError, match="no problem of arith_train fits max_prompt_tokens 1"):
        plan_run(resolve_run(_tiny(tiny_model_dir, max_prompt_tokens=1)))


def test_a_prompt_limit_is_refused_where_the_prompt_is_known_only_at_run_time() -> None:
    apollo = ProtocolConfig(name="apollo", apollo=ApolloConfig(tools=["python"]))
    config = GRPOTrainConfig(protocol=apollo, max_prompt_tokens=512)
    with pytest.raises(UserError, match="max_prompt_tokens is not offered for the apollo"):
        resolve_run(config)
    with pytest.raises(UserError, match="max_prompt_tokens"):
        GRPOTrainConfig(max_prompt_tokens=0).check()


# -- steps: 0, one epoch -----------------------------------------------------------------


def test_one_epoch_is_the_kept_problems_over_the_launchs_optimizer_steps() -> None:
    # EAPO's paper config on 8 processes: 1 completion × 32 accumulated × 8 = 256 per step.
    config = _paper("eapo-r1-distill-7b.yaml", steps=0)
    problems = len(load_benchmark(config.data, Fields.of(config)).items)
    zero3 = CONFIGS / "accelerate" / "zero3.yaml"
    rows = _rows(plan_run(resolve_run(config), zero3))
    steps = math.ceil(problems * 8 / 256)
    assert rows["steps"] == f"{steps} (one epoch of {problems} problems on 8 processes)"
    # `accelerate launch --num_processes 4` with the same accumulation: twice the steps.
    rows = _rows(plan_run(resolve_run(config), zero3, num_processes=4))
    assert rows["steps"].startswith(f"{math.ceil(problems * 8 / 128)} (one epoch")
    assert rows["processes"] == "4 (--num-processes)"


def test_a_resume_keeps_the_epoch_its_run_started_with(tmp_path: Path) -> None:
    config = _tiny(Path("model"), steps=0)
    first = pin_steps(config, tmp_path, problems=9, world=1)
    assert first.steps == 9  # 9 problems × G 2 / 2 completions a step
    save_config(first, tmp_path / runs.CONFIG)
    resumed = dataclasses.replace(config, resume=True)
    assert pin_steps(resumed, tmp_path, problems=99, world=1).steps == 9
    assert pin_steps(dataclasses.replace(config, steps=5), tmp_path, 99, 1).steps == 5


def test_a_run_of_one_epoch_trains_on_the_problems_that_fit(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = _tiny(tiny_model_dir, out=str(tmp_path / "run"), steps=0)
    lengths = prompt_lengths(resolve_run(config), load_benchmark("arith_train", limit=4))
    limit = min(lengths)
    kept = sum(n <= limit for n in lengths)
    assert kept < 4
    lines: list[str] = []
    result = train_grpo(
        resolve_run(dataclasses.replace(config, max_prompt_tokens=limit)), report=lines.append
    )
    assert f"max_prompt_tokens {limit}: {kept} of 4 problems kept, {4 - kept} dropped" in lines[0]
    assert result.steps == kept  # one epoch: a problem's group of 2 per step
    saved = build_config(GRPOTrainConfig, [read_yaml(tmp_path / "run" / runs.CONFIG)])
    assert saved.steps == kept  # pinned: --resume trains no further
    with pytest.raises(UserError, match=f"already reached step {kept} of {kept}"):
        train_grpo(resolve_run(dataclasses.replace(config, max_prompt_tokens=limit, resume=True)))


# -- placement ---------------------------------------------------------------------------


def test_the_dry_run_warns_when_the_trainer_takes_a_local_servers_gpus(monkeypatch) -> None:
    config = _paper("eapo-r1-distill-7b.yaml")  # experts at http://127.0.0.1:8001/v1
    zero3 = CONFIGS / "accelerate" / "zero3.yaml"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = plan_run(resolve_run(config), zero3)
    (shared,) = [w for w in plan.warnings if "may share GPUs" in w]
    assert "the trainer's 8 processes take GPUs 0–7" in shared
    assert "http://127.0.0.1:8001/v1" in shared
    # The pipeline of docs/launch.md: the trainer on GPUs of its own.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    plan = plan_run(resolve_run(config), zero3, num_processes=4)
    assert not [w for w in plan.warnings if "GPU" in w and "bf16" not in w]
    assert _rows(plan)["trainer GPUs"] == "CUDA_VISIBLE_DEVICES=0,1,2,3: 4 processes"
    # The config file's 8 processes on the 4 GPUs listed: they would share.
    assert any("processes share GPUs" in w for w in plan_run(resolve_run(config), zero3).warnings)
    # An expert on another node is not this node's concern.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    remote = dataclasses.replace(config.protocol, experts=["http://expert-node:8001/v1"])
    plan = plan_run(resolve_run(dataclasses.replace(config, protocol=remote)), zero3)
    assert not [w for w in plan.warnings if "may share GPUs" in w]
