"""`collab train sft` with the tiny random model: a run folder whose final/ is a model
reference, LoRA on and off, refusals before any model loads, and kill-and-resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl.builders.relay_warmup import RelayWarmupConfig, build_relay_warmup
from collabrl.config import EngineConfig, SamplingConfig, save_config
from collabrl.engines.base import SamplingParams
from collabrl.engines.hf import TransformersEngine
from collabrl.errors import UserError
from collabrl.models import resolve_model
from collabrl.train.lora import LoraSettings
from collabrl.train.run import CHECKPOINTS, CURVES, FINAL, METRICS
from collabrl.train.sft import SFTTrainConfig, load_rows, train_sft
from tests.cli.test_cli import assert_one_line_error, collab

ROW = {
    "prompt": [
        {"role": "system", "content": "Please reason step by step."},
        {"role": "user", "content": "What is 8 + 6?"},
    ],
    "completion": [{"role": "assistant", "content": "8 + 6 is<call>20</call> 14. \\boxed{14}"}],
    "item_id": "a",
    "sample": 0,
}


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    lines = [json.dumps({**ROW, "item_id": f"a{i}"}) for i in range(4)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _config(model: Path, data: Path, out: Path, *sets: str, **changes) -> SFTTrainConfig:
    """Two rows a step, one step an update, no gradient checkpointing: a fast CPU run."""
    trl = {"max_steps": 2}
    for item in sets:
        key, value = item.split("=")
        trl[key] = int(value)
    return SFTTrainConfig(
        model=str(model),
        data=str(data),
        out=str(out),
        batch_size=2,
        gradient_accumulation_steps=1,
        max_length=128,
        activation_checkpointing=False,
        trl=trl,
        **changes,
    )


def test_two_steps_on_a_warmup_build_give_a_model_reference_that_generates(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    build = tmp_path / "warmup"
    build_relay_warmup(
        RelayWarmupConfig(
            model=str(tiny_model_dir),
            data="arith",
            limit=2,
            out=str(build),
            sampling=SamplingConfig(max_tokens=16, temperature=1.0, seed=3),
            engine=EngineConfig(batch_size=2),
        )
    )
    steps: list[tuple[int, int]] = []
    result = train_sft(_config(tiny_model_dir, build, tmp_path / "run"), lambda *p: steps.append(p))

    assert result.metrics["steps"] == 2 and steps[-1] == (2, 2)
    assert result.metrics["final_loss"] > 0 and result.metrics["resumed_from"] is None
    logged = [json.loads(line) for line in (result.out_dir / METRICS).read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [1, 2]
    assert {"learning_rate", "epoch"} <= set(logged[0])
    assert (result.out_dir / CURVES).stat().st_size > 0
    assert (result.out_dir / "config.yaml").is_file()

    final = result.out_dir / FINAL
    assert resolve_model(str(final)).kind == "hf"
    engine = TransformersEngine.from_ref(str(final), batch_size=1)
    [[completion]] = engine.generate(
        [[{"role": "user", "content": "What is 2 + 2?"}]], SamplingParams(max_tokens=4)
    )
    assert completion.token_ids


def test_lora_trains_an_adapter_and_final_holds_it_merged(
    tiny_model_dir: Path, rows_file: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    result = train_sft(
        _config(tiny_model_dir, rows_file, tmp_path, "save_steps=2", lora=LoraSettings(True, r=4))
    )

    adapter = next((tmp_path / CHECKPOINTS).glob("checkpoint-*"))
    assert (adapter / "adapter_config.json").is_file()  # only the adapter was trained
    final = result.out_dir / FINAL
    assert not (final / "adapter_config.json").exists()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tuned = AutoModelForCausalLM.from_pretrained(final)
    assert set(tuned.state_dict()) == set(base.state_dict())
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(tuned.state_dict()[weight], base.state_dict()[weight])


def test_resume_continues_from_the_last_checkpoint(
    tiny_model_dir: Path, rows_file: Path, tmp_path: Path
) -> None:
    train_sft(_config(tiny_model_dir, rows_file, tmp_path, "save_steps=1"))
    # A longer run into the same folder starts at the checkpoint of step 2.
    result = train_sft(
        _config(tiny_model_dir, rows_file, tmp_path, "save_steps=1", "max_steps=3", resume=True)
    )

    assert result.metrics["resumed_from"] == 2 and result.metrics["steps"] == 3
    logged = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [1, 2, 3]
    assert (tmp_path / CHECKPOINTS / "checkpoint-3").is_dir()


def test_a_folder_with_checkpoints_needs_resume_and_resume_needs_checkpoints(
    tiny_model_dir: Path, rows_file: Path, tmp_path: Path
) -> None:
    with pytest.raises(UserError, match="no checkpoint to resume"):
        train_sft(_config(tiny_model_dir, rows_file, tmp_path, resume=True))
    (tmp_path / CHECKPOINTS / "checkpoint-1").mkdir(parents=True)
    with pytest.raises(UserError, match="pass --resume"):
        train_sft(_config(tiny_model_dir, rows_file, tmp_path))


def test_another_experiment_in_the_folder_is_refused(
    tiny_model_dir: Path, rows_file: Path, tmp_path: Path
) -> None:
    (tmp_path / METRICS).write_text('{"step": 1, "loss": 1.0}\n')
    save_config(_config(tiny_model_dir, rows_file, tmp_path), tmp_path / "config.yaml")
    # A longer run may resume; another learning rate is another experiment.
    with pytest.raises(UserError, match="different learning_rate"):
        train_sft(_config(tiny_model_dir, rows_file, tmp_path, learning_rate=1e-4))


def test_the_flat_lora_keys_of_0_1_are_read_into_the_lora_section(capsys) -> None:
    from collabrl.config import build_config

    config = build_config(SFTTrainConfig, [{"lora": True, "lora_r": 4, "lora_dropout": 0.1}])
    assert (config.lora.enabled, config.lora.r, config.lora.dropout) == (True, 4, 0.1)
    assert "'lora_r' is now 'lora.r'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"data": None}, "collab train sft needs data"),
        ({"learning_rate": 0.0}, "learning_rate must be"),
        ({"epochs": float("nan")}, "epochs must be"),
        ({"batch_size": 0}, "batch_size must be"),
        ({"warmup_ratio": 1.0}, "warmup_ratio must be"),
        ({"save_strategy": "never"}, "save_strategy must be"),
        ({"lora": LoraSettings(dropout=1.0)}, "lora.dropout must be"),
        ({"lora": LoraSettings(target_modules=[])}, "lora.target_modules must be"),
        ({"final_dtype": "float8"}, "final_dtype must be"),
        ({"trl": {"max_stepz": 2}}, "trl.max_stepz is not a TRL SFTConfig argument"),
        ({"trl": {"output_dir": "x"}}, "trl.output_dir is set by collab train"),
    ],
)
def test_impossible_values_are_refused_before_loading(changes: dict, message: str) -> None:
    config = SFTTrainConfig(**{"data": "rows.jsonl", **changes})
    with pytest.raises(UserError, match=message):
        config.check()


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[2] / "configs" / "train").glob("sft-*.yaml"))
)
def test_the_sample_configs_load_and_pass_the_checks(path: Path) -> None:
    from collabrl.cli.options import load_config

    load_config("train-sft", path, {}, ["data=rows.jsonl"]).check()


def test_rows_without_prompt_and_completion_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "hello"}\n')
    with pytest.raises(UserError, match="no completion or prompt column"):
        load_rows(str(path))
    with pytest.raises(UserError, match="no training rows at"):
        load_rows(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="neither a builder folder nor a datasets folder"):
        load_rows(str(tmp_path))


def test_cli_trains_and_refuses_in_one_line(
    tiny_model_dir: Path, rows_file: Path, tmp_path: Path
) -> None:
    common = ["train", "sft", "--model", str(tiny_model_dir), "--data", str(rows_file)]
    sets = ["--set", "batch_size=2", "--set", "gradient_accumulation_steps=1"]
    sets += ["--set", "trl.max_steps=1", "--set", "activation_checkpointing=false"]
    result = collab(*common, "--out", str(tmp_path / "run"), *sets, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "1 steps" in result.stdout and str(tmp_path / "run" / FINAL) in result.stdout

    refused = collab(*common, "--lr", "0", cwd=tmp_path)
    assert_one_line_error(refused, "--learning-rate: learning_rate must be in (0, 1)")


@pytest.mark.slow
def test_the_cpu_demo_config_trains_smollm2(rows_file: Path, tmp_path: Path) -> None:
    from collabrl.cli.options import load_config

    demo = Path(__file__).parents[2] / "configs" / "train" / "sft-cpu-demo.yaml"
    sets = [f"data={rows_file}", f"out={tmp_path}", "trl.max_steps=2"]
    result = train_sft(load_config("train-sft", demo, {}, sets))

    assert result.metrics["steps"] == 2 and result.metrics["final_loss"] > 0
    engine = TransformersEngine.from_ref(str(result.out_dir / FINAL), batch_size=1)
    [[completion]] = engine.generate(
        [[{"role": "user", "content": "What is 2 + 2?"}]], SamplingParams(max_tokens=8)
    )
    assert completion.text


# As Qwen3's template does: the answer turn of a conversation opens with a think block
# (empty without reasoning); the generation prompt holds the empty block only when
# enable_thinking is false.
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}<think>\n\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def test_the_rows_render_with_the_configs_chat_template_options(
    tiny_model_dir: Path, rows_file: Path, tmp_path: Path
) -> None:
    """Qwen3-style: with enable_thinking false the prompt the warm-up learns after is the
    one the RL run and collab eval send (ending in the empty think block), so the model
    does not learn to write that block itself, which the default rendering teaches."""
    from collabrl.models import load_model, load_tokenizer
    from collabrl.train.sft import _trainer, load_rows, with_template_options

    tokenizer = load_tokenizer(str(tiny_model_dir))
    tokenizer.chat_template = QWEN3_LIKE
    model = load_model(str(tiny_model_dir))

    def learned(options: dict) -> str:
        """The text of row 0 the loss is taken on."""
        config = _config(tiny_model_dir, rows_file, tmp_path / "out", chat_template_kwargs=options)
        rows = with_template_options(load_rows(str(rows_file)), config.chat_template_kwargs)
        row = _trainer(config, rows, model, tokenizer, tmp_path / "out").train_dataset[0]
        return tokenizer.decode([label for label in row["labels"] if label != -100])

    # (The blank line after </think> tokenizes with the answer's first word, so TRL
    # counts it to the completion.)
    assert learned({"enable_thinking": False}).lstrip("\n").startswith("8 + 6 is")
    assert learned({}).startswith("<think>")  # the rows' default rendering
