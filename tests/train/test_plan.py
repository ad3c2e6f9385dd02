"""`collab train METHOD --dry-run`: every shipped config resolves without loading a
weight, the memory arithmetic by hand and its terms (issue 32: the reference model
counted exactly when TRL loads one, activations and the LM head in the dtype the run
computes in, TRL's chunked head instead of whole logits, paper models sized from the
shapes shipped for them; bench/memory_estimate.py holds the estimate against measured
peaks), and bad settings refused with one line."""

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
from collabrl.train.lora import LoraSettings
from collabrl.train.memory import (
    GIB,
    SHAPES,
    ModelShape,
    estimate_memory,
    model_shape,
    shape_from_config,
    shape_from_name,
    shipped_shape,
)
from collabrl.train.methods import registry as methods
from collabrl.train.plan import plan_run
from collabrl.train.resolve import resolve_run

CONFIGS = Path(__file__).parents[2] / "configs" / "train"
GRPO_CONFIGS = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("sft-"))
SHAPE = ModelShape(
    parameters=GIB, hidden_size=1000, layers=10, vocab_size=50_000, intermediate_size=3000
)


def _estimate(shape: ModelShape = SHAPE, **changes):
    """The estimate for `shape` on 8 processes, 2 × 100 tokens, nothing sharded."""
    settings = dict(
        micro_batch=2,
        sequence=100,
        checkpointing=False,
        world_size=8,
        zero_stage=0,
        vllm_fraction=None,
    )
    return estimate_memory(shape, **(settings | changes))


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
    plan = plan_run(resolve_run(_load(path)))
    rows = _rows(plan)
    sections = {"run", "TRL (effective)", "batch (completions)", "who runs where"}
    assert sections | {"memory per device (estimate)"} <= set(plan.sections)
    assert rows["method"] == path.stem.split("-")[0]
    assert rows["protocol"] == methods.get(rows["method"]).protocol  # the method's, not solo


def test_the_relay_paper_config_shows_its_effective_settings() -> None:
    rows = _rows(plan_run(resolve_run(_load(CONFIGS / "relay-qwen3-1.7b.yaml"))))
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
        plan_run(resolve_run(config))
    named = dataclasses.replace(config, problem_field="q", answer_field="a", eval_limit=18)
    rows = _rows(plan_run(resolve_run(named)))
    assert rows["problems"] == "2" and rows["held-out"] == "18 (arith)"
    elsewhere = _load(CONFIGS / "grpo-cpu-arith.yaml", data="/cluster/data.jsonl")
    assert (
        "problems '/cluster/data.jsonl' is not on this machine"
        in plan_run(resolve_run(elsewhere)).warnings
    )


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
    alone = _estimate(shape)
    assert (alone.weights, alone.gradients, alone.optimizer) == (4, 4, 8)  # 16 B/param
    # 4 MLP-wide tensors (4 × 1000 without an intermediate size) and 10 hidden-wide in
    # bf16, the norms' 4 in fp32 (2 bytes more each): (10 + 16) × 2 + 4 × 2 = 60 bytes.
    assert alone.activations == pytest.approx(2 * 100 * 1000 * 10 * 60 / GIB)
    # One bf16 tile of TRL's head (200 tokens × the vocabulary of 500), and the fp32
    # gradients of the head's weight and the hidden states.
    assert alone.logits == pytest.approx((200 * 500 * 2 + (500 + 200) * 1000 * 4) / GIB)
    zero3 = _estimate(shape, checkpointing=True, zero_stage=3, vllm_fraction=0.3)
    assert (zero3.weights, zero3.gradients, zero3.optimizer) == (0.5, 0.5, 1.0)
    # One hidden state per layer (bf16 under DeepSpeed), and the layer being recomputed.
    expected = 2 * 100 * 1000 * (10 * 2 + 60) / GIB
    assert zero3.activations == pytest.approx(expected)
    zero1 = _estimate(
        shape, micro_batch=1, sequence=1, checkpointing=True, world_size=4, zero_stage=1
    )
    assert (zero1.weights, zero1.gradients, zero1.optimizer) == (4, 4, 2)


def test_the_launch_comes_from_the_accelerate_config(tmp_path: Path) -> None:
    config = _load(CONFIGS / "eapo-r1-distill-7b.yaml")
    zero3 = Path(__file__).parents[2] / "configs" / "accelerate" / "zero3.yaml"
    rows = _rows(plan_run(resolve_run(config), zero3))
    assert rows["processes"] == f"8 ({zero3})" and rows["ZeRO stage"] == "3"
    # R1-Distill-Qwen-7B's shipped shape, 7.62e9 params × 16 B / 8 processes.
    state = rows["weights + gradients + AdamW (16 B a parameter)"]
    assert state == f"{7_615_616_512 * 16 / 8 / GIB:.1f} GiB"
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_processes: eight\n")
    with pytest.raises(UserError, match="num_processes must be a positive integer"):
        plan_run(resolve_run(config), bad)


def test_rsim_counts_the_planner_it_trains() -> None:
    config = _load(CONFIGS / "rsim-qwen2.5-0.5b.yaml")
    rows = _rows(plan_run(resolve_run(config)))
    assert rows["planner"].endswith("trained beside the policy in every process (float32, DDP)")
    state = 494_032_768 * 16 / GIB  # Qwen2.5-0.5B's shipped shape, 16 bytes a parameter
    assert rows["planner weights + gradients + AdamW"] == f"{state:.1f} GiB"
    assert float(rows["training total"].split()[0]) > 2 * state  # and the activations


def test_the_reference_model_is_counted_when_trl_loads_one() -> None:
    assert _estimate(reference=False).reference == 0
    # TRL builds it in the policy's dtype: fp32, as collabrl loads the policy.
    assert _estimate(reference=True).reference == 4
    # DeepSpeed in bf16 casts it to bf16; ZeRO-3 shards it over the 8 processes.
    assert _estimate(reference=True, zero_stage=2).reference == 2
    assert _estimate(reference=True, zero_stage=3).reference == 2 / 8
    assert _estimate(reference=True, bf16=False, zero_stage=3).reference == 4 / 8
    # With LoRA the adapter is disabled instead, and only the adapter trains.
    lora = _estimate(reference=True, lora=True)
    assert (lora.reference, lora.weights, lora.gradients, lora.optimizer) == (0, 4, 0, 0)
    assert _estimate(reference=True).training == pytest.approx(_estimate().training + 4)


def test_activations_and_the_lm_head_are_in_the_runs_dtype() -> None:
    tokens = 2 * 100
    # bf16: 10 hidden-wide and 4 MLP-wide tensors a layer, the norms' 4 in fp32.
    per_layer = (10 * 1000 + 4 * 3000) * 2 + 4 * 1000 * 2
    assert _estimate().activations == pytest.approx(tokens * 10 * per_layer / GIB)
    fp32 = (10 * 1000 + 4 * 3000) * 4
    assert _estimate(bf16=False).activations == pytest.approx(tokens * 10 * fp32 / GIB)
    # TRL's head: one tile (200 tokens × 32768 of the vocabulary) in the compute dtype,
    # plus the fp32 gradients of the head's weight and of the hidden states.
    head = (50_000 + tokens) * 1000 * 4
    assert _estimate().logits == pytest.approx((tokens * 32768 * 2 + head) / GIB)
    # Without Triton (a CPU), torch ops hold 6 fp32 tiles besides the fp32 tile.
    cpu = _estimate(bf16=False, triton=False).logits
    assert cpu == pytest.approx((tokens * 32768 * (4 + 6 * 4) + head) / GIB)
    # Never the whole micro-batch × sequence × vocabulary logits: tiles of 4096 tokens.
    long = _estimate(micro_batch=16, sequence=9216).logits
    whole = 16 * 9216 * 50_000 * 2 / GIB
    assert long == pytest.approx((4096 * 32768 * 2 + (50_000 + 16 * 9216) * 1000 * 4) / GIB)
    assert long < whole / 5


def test_paper_models_are_sized_from_their_shipped_shapes() -> None:
    r1 = model_shape("./DeepSeek-R1-Distill-Qwen-7B")
    assert r1 is not None and r1.source.startswith("the shipped shape")
    assert round(r1.parameters / 1e9, 2) == 7.62  # not the name's 7
    assert (r1.hidden_size, r1.intermediate_size, r1.vocab_size) == (3584, 18944, 152064)
    # A run folder named after its base model, and an -Instruct of the same shape.
    assert model_shape("runs/sft-relay-qwen3-1.7b/final").parameters == 1_720_574_976
    assert shipped_shape("Qwen/Qwen2.5-0.5B-Instruct").parameters == 494_032_768
    assert shipped_shape("./Qwen2.5-7B").parameters == r1.parameters
    assert shipped_shape("./Qwen2.5-70B") is None and shipped_shape("my-qwen3-1.7b2") is None
    assert model_shape("./Llama-3-8B").source == "its name"  # nothing shipped: the name


def test_shipped_shapes_load_with_autoconfig() -> None:
    from transformers import AutoConfig

    for folder in (f for f in SHAPES.iterdir() if f.is_dir()):
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        assert config.model_type in ("qwen2", "qwen3")


def test_the_dry_run_shows_every_term() -> None:
    relay = build_config(GRPOTrainConfig, [read_yaml(CONFIGS / "relay-qwen3-1.7b.yaml")])
    rows = _rows(plan_run(resolve_run(relay)))
    assert rows["parameters"] == "1.72 B (from the shipped shape shapes/Qwen3-1.7B)"
    reference = 1_720_574_976 * 4 / GIB  # beta 0.01, one process: an fp32 copy
    assert rows["reference model"] == f"{reference:.1f} GiB (beta 0.01)"
    assert any(key.startswith("activations (2 × ") for key in rows)
    assert any(key.startswith("log-probs (TRL's chunked LM head") for key in rows)
    assert "training total" in rows
    eapo = build_config(GRPOTrainConfig, [read_yaml(CONFIGS / "eapo-r1-distill-7b.yaml")])
    assert _rows(plan_run(resolve_run(eapo)))["reference model"] == "none (beta 0)"


@pytest.mark.slow
def test_the_bench_holds_the_estimate_within_its_tolerance() -> None:
    """One method at one size of bench/memory_estimate.py: two real steps in a child
    process, their peak resident memory against the dry run's figure."""
    import subprocess
    import sys

    bench = Path(__file__).parents[2] / "bench" / "memory_estimate.py"
    command = [sys.executable, str(bench), "--methods", "grpo", "--sizes", "small"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "grpo   small" in done.stdout


# LoRA targets are checked against the model's config.json, by the run and its dry run.
@pytest.mark.parametrize(
    "targets",
    [["all-linear"], ["q_proj", "v_proj"], ["self_attn.q_proj", "lm_head"], ["embed_tokens"]],
)
def test_lora_targets_the_model_has_pass(targets: list[str], tiny_model_dir: Path) -> None:
    lora = LoraSettings(enabled=True, target_modules=targets)
    lora.check()
    lora.check_targets(str(tiny_model_dir))


@pytest.mark.parametrize(
    ("targets", "missing"),
    [
        (["q_proj", "qkv_proj"], "qkv_proj"),  # peft would skip it silently beside q_proj
        (["self_attn"], "self_attn"),  # a module, but none LoRA adapts (peft raises)
        (["mlp.q_proj"], "mlp.q_proj"),
    ],
)
def test_lora_targets_the_model_lacks_are_refused(targets, missing, tiny_model_dir) -> None:
    lora = LoraSettings(enabled=True, target_modules=targets)
    with pytest.raises(UserError, match=f"has no module '{missing}' LoRA can adapt") as caught:
        lora.check_targets(str(tiny_model_dir))
    assert "q_proj, up_proj, v_proj" in caught.value.fix  # what it has, to pick from
    LoraSettings(enabled=False, target_modules=targets).check_targets(str(tiny_model_dir))


def test_lora_targets_of_a_model_not_here_are_left_to_the_run() -> None:
    """A dry run plans for a cluster's folder: its modules are not known here."""
    LoraSettings(enabled=True, target_modules=["qkv"]).check_targets("elsewhere/Qwen3-8B")


def test_all_linear_beside_other_names_is_refused() -> None:
    """peft reads all-linear only alone: in a list it adapts just the other names."""
    from collabrl.train.lora import LoraSettings

    with pytest.raises(UserError, match="all-linear alone, or module names"):
        LoraSettings(enabled=True, target_modules=["all-linear", "q_proj"]).check()
