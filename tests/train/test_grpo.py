"""`train_grpo` end to end on the tiny random model: the run folder, relay with the
reference teacher, refusals, and resuming from a checkpoint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from collabrl.config import DecodingConfig
from collabrl.errors import UserError
from collabrl.protocols.apollo import ApolloConfig
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.consult_config import ConsultConfig, turn_tokens
from collabrl.protocols.relay_config import RelayConfig
from collabrl.train.grpo import train_grpo
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.lora import LoraSettings
from collabrl.train.resolve import resolve_run
from collabrl.train.run import CURVES, METRICS


def _config(model: Path, out: Path, **changes) -> GRPOTrainConfig:
    fields = {
        "model": str(model),
        "data": "arith_train",
        "limit": 8,
        "out": str(out),
        "steps": 2,
        "prompts_per_step": 2,
        "sampling": DecodingConfig(n=2, max_tokens=16, temperature=1.0),
        "save_steps": 1,
    }
    return GRPOTrainConfig(**(fields | changes))


def test_grpo_writes_metrics_curves_and_a_loadable_model(tiny_model_dir: Path, tmp_path) -> None:
    from collabrl.engines.hf import TransformersEngine

    result = train_grpo(resolve_run(_config(tiny_model_dir, tmp_path)))
    assert result.steps == 2
    steps = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    logged = [s for s in steps if "reward" in s]
    assert [s["step"] for s in logged] == [1, 2]
    assert {"episodes/accuracy", "episodes/call_ratio", "rewards/accuracy/mean"} <= set(logged[0])
    # Sampled at temperature 1 with a seed per sample: no group is one repeated text.
    assert all(s["episodes/identical_groups"] == 0 for s in logged)
    assert all("frac_reward_zero_std" in s for s in logged)
    assert (tmp_path / CURVES).is_file()
    engine = TransformersEngine.from_ref(str(tmp_path / "final"))  # a model reference again
    engine.close()


# The settings that follow the authors' released code rather than the paper's text (with
# `protocol.relay` train_teacher_tokens and rollback, below).
AUTHORS_CODE = {"scenario_scope": "batch", "call_ratio": "per_call", "tokens_per_call": 250}


@pytest.mark.parametrize("authors_code", [False, True])
def test_relay_with_the_reference_teacher_runs(
    tiny_model_dir: Path, tmp_path, authors_code: bool
) -> None:
    relay = RelayConfig(train_teacher_tokens=authors_code, rollback=authors_code)
    config = _config(
        tiny_model_dir,
        tmp_path,
        method="relay",
        steps=1,
        protocol=ProtocolConfig(teacher="reference", relay=relay),
        **(AUTHORS_CODE if authors_code else {}),
    )
    train_grpo(resolve_run(config))
    (step,) = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()][:1]
    assert "rewards/relay_difficulty_aware/mean" in step
    # The per-call ρ is logged when the reward charges it, and only then.
    assert ("episodes/call_ratio_per_call" in step) == authors_code


def test_resume_continues_from_the_last_checkpoint(tiny_model_dir: Path, tmp_path) -> None:
    train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, steps=1)))
    result = train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, steps=2, resume=True)))
    assert result.steps == 2
    logged = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    assert [s["step"] for s in logged if "reward" in s] == [1, 2]  # step 1 was not redone


def test_resuming_a_run_that_reached_its_steps_is_refused(tiny_model_dir: Path, tmp_path) -> None:
    train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, steps=1)))
    with pytest.raises(UserError, match="already reached step 1 of 1"):
        train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, steps=1, resume=True)))


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"method": "ppo"}, "unknown method"),
        ({"sampling": DecodingConfig(n=1, temperature=1.0)}, "sampling.n"),
        ({"method": "relay"}, "needs a teacher"),
        ({"reward": "fancy"}, "unknown reward"),
        ({"trl": {"max_stepz": 2}}, "trl.max_stepz is not a TRL GRPOConfig argument"),
        ({"trl": {"output_dir": "x"}}, "trl.output_dir is set by collab train"),
        ({"trl": {"temperature": 0.5}}, "trl.temperature is collab train's sampling.temperature"),
        ({"trl": {"max_completion_length": 9}}, "trl.max_completion_length is collab train's"),
        ({"trl": {"num_generations": 8}}, "set sampling.n instead"),
        ({"protocol": ProtocolConfig(name="consult")}, "rolls out on solo or apollo"),
        (
            {"method": "relay", "protocol": ProtocolConfig(name="apollo", teacher="x")},
            "rolls out on relay, not 'apollo'",
        ),
    ],
)
def test_bad_configs_are_refused_before_any_model_loads(changes, fragment, tmp_path) -> None:
    with pytest.raises(UserError, match=fragment):
        train_grpo(resolve_run(_config(Path("no-such-model"), tmp_path, **changes)))


def test_grpo_on_apollo_trains_with_the_tools_in_the_rollout(
    tiny_model_dir: Path, tmp_path
) -> None:
    # force_call: every episode opens with the <tool_call> tag (environment text, masked).
    apollo = ApolloConfig(tools=["python"], force_call=True)
    config = _config(
        tiny_model_dir, tmp_path, protocol=ProtocolConfig(name="apollo", apollo=apollo)
    )
    result = train_grpo(resolve_run(config))
    assert result.steps == 2
    steps = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    logged = [s for s in steps if "reward" in s]
    assert {"episodes/tool_calls", "episodes/tool_errors"} <= set(logged[0])


def test_resume_without_checkpoints_is_refused(tiny_model_dir: Path, tmp_path) -> None:
    with pytest.raises(UserError, match="no checkpoint to resume"):
        train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, resume=True)))


def test_eapo_refuses_a_budget_that_cannot_hold_one_consult_turn(
    tiny_model_dir: Path, tmp_path
) -> None:
    """3 experts × 512 tokens cannot fit a 16-token episode: asking them all would end it
    unanswered, so the run (and its dry run, which runs the same check) refuses."""
    config = _config(
        tiny_model_dir, tmp_path, method="eapo", protocol=ProtocolConfig(experts=["reference"])
    )
    with pytest.raises(UserError, match="cannot hold one consult turn of 1744 tokens"):
        resolve_run(config)


def test_eapo_with_reference_experts_follows_the_acceptance_schedule(
    tiny_model_dir: Path, tmp_path
) -> None:
    # One expert writing 8 tokens: a budget of one full consult turn (query, answer, final
    # answer), the least `collab train eapo` accepts.
    consult = ConsultConfig(num_experts=1, expert_max_tokens=8)
    config = _config(
        tiny_model_dir,
        tmp_path,
        method="eapo",
        protocol=ProtocolConfig(experts=["reference"], consult=consult),
        sampling=DecodingConfig(n=2, max_tokens=turn_tokens(consult), temperature=1.0),
    )
    train_grpo(resolve_run(config))
    logged = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    steps = [s for s in logged if "reward" in s]
    assert "rewards/eapo/mean" in steps[0] and "episodes/accepted_calls" in steps[0]
    # ρ_s = 1/s, set on the protocol before each step and recorded on its episodes.
    assert [s["episodes/accept_prob"] for s in steps] == [1.0, 0.5]
    # EAPO's Figure 4: the share of each step's episodes that consulted (consult_rate).
    assert all(0.0 <= s["episodes/consult_rate"] <= 1.0 for s in steps)
    assert [s["turn_budget"] for s in steps] == [6, 1]  # annealed over the 2-step run


def test_a_held_out_evaluation_scores_the_start_and_the_trained_policy(
    tiny_model_dir: Path, tmp_path
) -> None:
    config = _config(tiny_model_dir, tmp_path, steps=1, eval_data="arith", eval_limit=3)
    result = train_grpo(resolve_run(config))
    assert set(result.evaluation) == {"start", "final", "paired"}
    assert result.evaluation["final"]["problems"] == 3
    correct = {
        name: [
            json.loads(line)["correct"]
            for line in (tmp_path / f"eval-{name}" / "samples.jsonl").open()
        ]
        for name in ("start", "final")
    }
    pairs = list(zip(correct["start"], correct["final"], strict=True))
    paired = result.evaluation["paired"]
    assert paired["gained"] == sum(not s and f for s, f in pairs)
    assert paired["lost"] == sum(s and not f for s, f in pairs)
    assert 0 < paired["p_value"] <= 1
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["start"]["pass@1"] == result.evaluation["start"]["pass@1"]
    assert (tmp_path / "eval-final" / "samples.jsonl").is_file()


def test_a_mistyped_held_out_set_fails_before_training(tiny_model_dir: Path, tmp_path) -> None:
    with pytest.raises(UserError, match="unknown benchmark"):
        train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, eval_data="no-such-set")))
    assert not (tmp_path / METRICS).exists()


def _two_split_folder(path: Path) -> Path:
    """A saved DatasetDict with its own column names, a train and a test split."""
    import datasets

    def rows(split: str, count: int) -> datasets.Dataset:
        return datasets.Dataset.from_list(
            [
                {"key": f"{split}-{i}", "question": f"What is {i} + 1?", "target": str(i + 1)}
                for i in range(count)
            ]
        )

    datasets.DatasetDict({"train": rows("train", 4), "test": rows("test", 3)}).save_to_disk(path)
    return path


def test_the_held_out_set_reads_the_training_columns_and_its_own_split(
    tiny_model_dir: Path, tmp_path
) -> None:
    data = str(_two_split_folder(tmp_path / "data"))
    columns = {"problem_field": "question", "answer_field": "target", "id_field": "key"}
    out = tmp_path / "run"
    config = _config(tiny_model_dir, out, steps=1, data=data, eval_data=data, **columns)
    with pytest.raises(UserError, match="holds the splits"):  # before any work
        train_grpo(resolve_run(dataclasses.replace(config, split="train")))
    assert not out.exists()
    train_grpo(resolve_run(dataclasses.replace(config, split="train", eval_split="test")))
    samples = (out / "eval-final" / "samples.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["item_id"] for line in samples) == ["test-0", "test-1", "test-2"]


# ---------------------------------------------------------------- the GRPOConfig it builds


@pytest.mark.parametrize(
    ("trl", "on"),
    [
        ({}, False),
        ({"gradient_checkpointing": True}, True),
        ({"activation_checkpointing": True}, True),
        ({"gradient_checkpointing": True, "activation_checkpointing": True}, True),
        ({"activation_checkpointing": False}, False),
    ],
)
def test_the_trl_blocks_checkpointing_switch_decides_under_either_name(trl, on, tmp_path) -> None:
    from collabrl.train.grpo_args import grpo_args

    config = _config(Path("m"), tmp_path, trl=trl)
    config.check()
    args = grpo_args(config, tmp_path)
    # What transformers' Trainer reads (5.20 on), and the mirror TRL reads.
    assert getattr(args, "activation_checkpointing", args.gradient_checkpointing) is on
    assert args.gradient_checkpointing is on


def test_checkpointing_kwargs_pass_under_either_name(tmp_path) -> None:
    from collabrl.train.grpo_args import grpo_args

    trl = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"every_n_layers": 2}}
    args = grpo_args(_config(Path("m"), tmp_path, trl=trl), tmp_path)
    assert args.gradient_checkpointing_kwargs == {"every_n_layers": 2}


@pytest.mark.parametrize(
    ("trl", "fragment"),
    [
        (
            {"gradient_checkpointing": True, "activation_checkpointing": False},
            "disagree",
        ),
        ({"use_vllm": True, "vllm_tensor_parallel_size": 2}, "colocated vLLM"),
        (
            {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 4},
            "trl vllm-serve --model PATH --tensor-parallel-size 4",
        ),
    ],
)
def test_trl_blocks_no_run_can_use_are_refused_by_check(trl, fragment, tmp_path) -> None:
    from collabrl.train.grpo_args import check_run

    config = _config(Path("m"), tmp_path, trl=trl)
    with pytest.raises(UserError, match=fragment) as caught:
        check_run(config)
    assert "\n" not in str(caught.value)  # one line


@pytest.mark.parametrize(
    "trl",
    [
        {"use_vllm": True, "vllm_mode": "server", "vllm_tensor_parallel_size": 4},
        {"use_vllm": False, "vllm_tensor_parallel_size": 4},
        {"use_vllm": True, "vllm_tensor_parallel_size": 1},
    ],
)
def test_tensor_parallel_vllm_is_fine_where_the_rollout_goes_through_trl(trl, tmp_path) -> None:
    from collabrl.train.grpo_args import check_run

    check_run(_config(Path("m"), tmp_path, trl=trl))


def test_importance_sampling_is_per_token_unless_the_trl_block_says_otherwise(tmp_path) -> None:
    from collabrl.train.grpo_args import grpo_args

    assert grpo_args(_config(Path("m"), tmp_path), tmp_path).vllm_importance_sampling_mode == (
        "token_truncate"
    )
    trl = {"vllm_importance_sampling_mode": "sequence_mask"}
    args = grpo_args(_config(Path("m"), tmp_path, trl=trl), tmp_path)
    assert args.vllm_importance_sampling_mode == "sequence_mask"


def test_a_generation_batch_that_splits_a_group_is_a_user_error(tmp_path) -> None:
    from collabrl.train.grpo_args import grpo_args

    # 1 sample a micro-batch × 3 micro-batches: a group of 2 would straddle generations.
    trl = {"per_device_train_batch_size": 1, "steps_per_generation": 3}
    with pytest.raises(UserError, match="invalid TRL settings: generation_batch_size"):
        grpo_args(_config(Path("m"), tmp_path, trl=trl), tmp_path)


def test_the_sampling_section_sets_trls_mirrored_arguments(tmp_path) -> None:
    from collabrl.train.grpo_args import grpo_args

    sampling = DecodingConfig(n=2, max_tokens=16, temperature=0.7, top_p=0.9, top_k=-1)
    args = grpo_args(_config(Path("m"), tmp_path, sampling=sampling), tmp_path)
    assert (args.num_generations, args.max_completion_length) == (2, 16)
    assert (args.temperature, args.top_p, args.top_k) == (0.7, 0.9, 0)  # TRL's "no top-k"


def test_the_flat_sampling_keys_of_0_1_are_read_as_the_sampling_section(capsys) -> None:
    from collabrl.config import build_config

    old = {"num_generations": 3, "max_tokens": 5, "temperature": 0.5}
    config = build_config(GRPOTrainConfig, [old])
    assert (config.sampling.n, config.sampling.max_tokens, config.sampling.temperature) == (
        3,
        5,
        0.5,
    )
    assert "'num_generations' is now 'sampling.n'" in capsys.readouterr().err


def test_lora_trains_an_adapter_through_the_rollout_and_final_is_what_lora_merge_says(
    tiny_model_dir: Path, tmp_path
) -> None:
    import torch
    from safetensors.torch import load_file

    from collabrl.models import resolve_model

    merged = train_grpo(
        resolve_run(_config(tiny_model_dir, tmp_path / "merged", lora=LoraSettings(True, r=4)))
    )
    checkpoint = next((merged.out_dir / "checkpoints").glob("checkpoint-*"))
    assert (checkpoint / "adapter_config.json").is_file()  # only the adapter trained
    assert resolve_model(str(merged.out_dir / "final")).kind == "hf"
    adapter = train_grpo(
        resolve_run(
            _config(
                tiny_model_dir,
                tmp_path / "adapter",
                lora=LoraSettings(True, r=4, merge=False),
                final_dtype="bfloat16",  # not applied to an adapter alone
            )
        )
    )
    final = adapter.out_dir / "final"
    assert resolve_model(str(final)).kind == "lora"
    weights = load_file(str(final / "adapter_model.safetensors"))
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}


def test_final_is_saved_in_the_dtype_asked_for(tiny_model_dir: Path, tmp_path) -> None:
    import torch
    from safetensors.torch import load_file

    result = train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, final_dtype="bfloat16")))
    weights = load_file(str(result.out_dir / "final" / "model.safetensors"))
    assert {tensor.dtype for tensor in weights.values()} == {torch.bfloat16}


def test_training_data_in_its_own_column_layout(tiny_model_dir: Path, tmp_path) -> None:
    rows = [
        {"question": f"What is {i} + 1?", "final": str(i + 1), "key": f"q{i}"} for i in range(4)
    ]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    columns = {"problem_field": "question", "answer_field": "final", "id_field": "key"}
    config = _config(tiny_model_dir, tmp_path / "run", data=str(data), steps=1, **columns)
    result = train_grpo(resolve_run(config))
    kept = [json.loads(line) for line in (result.out_dir / "rollouts.jsonl").open()]
    assert kept[0]["episode"]["problem_id"] == "q0" and kept[0]["gold"] == "1"
    with pytest.raises(UserError, match="has no 'problem' column"):
        train_grpo(resolve_run(_config(tiny_model_dir, tmp_path / "other", data=str(data))))


def test_the_held_out_set_is_scored_every_eval_steps(tiny_model_dir: Path, tmp_path) -> None:
    config = _config(
        tiny_model_dir, tmp_path, steps=2, eval_data="arith", eval_limit=2, eval_steps=1
    )
    lines: list[str] = []
    result = train_grpo(resolve_run(config), report=lines.append)
    logged = [row for row in result.history if "eval/pass@1" in row]
    assert [row["step"] for row in logged] == [1, 2]
    assert (tmp_path / "eval-step-1" / "metrics.json").is_file()
    assert (tmp_path / "eval-step-1" / "results.json").is_file()  # as `collab eval` writes
    assert any(line.startswith("held-out arith at step 2: pass@1 ") for line in lines)
    assert set(result.evaluation) == {"start", "final", "paired"}


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"eval_steps": 1}, "eval_steps needs a held-out set"),
        ({"eval_steps": 0, "eval_data": "arith"}, "eval_steps must be at least 1"),
        ({"eval_steps": 1, "eval_data": "arith", "method": "rsim"}, "not offered for rsim"),
    ],
)
def test_eval_steps_it_cannot_serve_are_refused(changes, problem, tmp_path) -> None:
    with pytest.raises(UserError, match=problem):
        _config(Path("m"), tmp_path, **changes).check()


def test_a_failed_end_of_run_evaluation_keeps_the_run_and_says_how_to_evaluate_it(
    tiny_model_dir: Path, tmp_path, monkeypatch
) -> None:
    """The trained policy's evaluation runs out of GPU memory (simulated: this CPU has
    none to run out of): final/, metrics.jsonl and the start's scores stay, the error is
    one line, and the command it names evaluates the trained policy."""
    import shlex

    import torch
    from typer.testing import CliRunner

    from collabrl.cli.main import app
    from collabrl.eval import runner

    real_run_eval = runner.run_eval

    def out_of_memory_on_final(config, **kwargs):
        if config.model.endswith("final"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\n...")
        return real_run_eval(config, **kwargs)

    monkeypatch.setattr(runner, "run_eval", out_of_memory_on_final)
    config = _config(tiny_model_dir, tmp_path, steps=1, eval_data="arith", eval_limit=2)
    with pytest.raises(UserError) as failed:
        train_grpo(resolve_run(config))
    message = str(failed.value)
    assert "\n" not in message and "OutOfMemoryError: CUDA out of memory" in message
    assert (tmp_path / "final" / "model.safetensors").is_file()
    assert any("reward" in json.loads(line) for line in (tmp_path / METRICS).open())
    assert (tmp_path / CURVES).is_file()
    assert json.loads((tmp_path / "eval.json").read_text()).keys() == {"start"}
    command = message.split("evaluate it with: ")[1]
    assert command.startswith("collab eval arith -c ") and "&&" not in command
    monkeypatch.undo()
    rerun = CliRunner().invoke(app, shlex.split(command)[1:])  # after "collab"
    assert rerun.exit_code == 0, rerun.output
    assert json.loads((tmp_path / "eval-final" / "metrics.json").read_text())["problems"] == 2


def test_the_trainer_is_freed_before_the_end_of_run_evaluation(
    tiny_model_dir: Path, tmp_path, monkeypatch
) -> None:
    """Nothing holds the trainer (TRL's colocated vLLM with it) once the evaluation's
    engine loads: its memory is free for that engine."""
    import gc

    from trl import GRPOTrainer

    from collabrl.eval import runner

    real_run_eval = runner.run_eval
    alive: list[int] = []

    def count_trainers(config, **kwargs):
        alive.append(sum(isinstance(o, GRPOTrainer) for o in gc.get_objects()))
        return real_run_eval(config, **kwargs)

    monkeypatch.setattr(runner, "run_eval", count_trainers)
    train_grpo(
        resolve_run(_config(tiny_model_dir, tmp_path, steps=1, eval_data="arith", eval_limit=1))
    )
    assert alive == [0, 0]  # start, final


GIB = 1024**3


@pytest.mark.parametrize(
    ("free", "kind", "share"),
    [
        (78 * GIB, "vllm", 0.8),  # an idle GPU: the configured share
        (40 * GIB, "vllm", 0.45),  # after training: 0.9 of what is free
        (20 * GIB, "transformers", None),  # 18 GiB would not hold 7.6B weights twice
    ],
)
def test_vllm_at_the_end_of_a_run_takes_the_memory_free_or_gives_way(free, kind, share) -> None:
    from collabrl.config import EngineConfig
    from collabrl.train.grpo import sized_engine

    engine = EngineConfig(kind="vllm", gpu_memory_utilization=0.8)
    sized = sized_engine(engine, weight_bytes=int(7.6e9) * 2, free=free, total=80 * GIB)
    assert sized.kind == kind
    if share is not None:
        assert sized.gpu_memory_utilization == pytest.approx(share)


def test_finding_the_main_process_leaves_the_process_group_to_trl() -> None:
    """accelerate's state is a singleton set up once: built before TRL's arguments (which
    pass it `trl.ddp_timeout`), it would fix the process group's timeout at the default."""
    import subprocess
    import sys

    code = (
        "from accelerate import PartialState\n"
        "from collabrl.train.launch import is_main_process, num_processes\n"
        "assert is_main_process() and num_processes() == 1\n"
        "print(bool(PartialState._shared_state))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
