"""Tests for collabrl.train.run's pieces every trainer shares: the line a step reports,
the experiment trackers a run may report to, and the final model a LoRA run saves."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl.errors import UserError
from collabrl.train.lora import LoraSettings
from collabrl.train.run import check_report_to, save_final, step_line, trackers


def test_a_step_line_shows_what_the_step_logged_with_time_and_eta() -> None:
    logs = {"reward": 0.25, "episodes/accuracy": 0.5, "episodes/call_ratio": 0.125, "x": 9}
    line = step_line(logs, step=3, max_steps=20, per_step=41.2)
    assert line == (
        "step 3/20 · reward 0.250 · accuracy 0.500 · call ratio 0.125 · 41.2 s/step · ETA 11m 40s"
    )


def test_a_step_line_of_a_loss_only_log() -> None:
    assert (
        step_line({"loss": 1.5}, 10, 10, 2.0) == "step 10/10 · loss 1.500 · 2.0 s/step · ETA 0m 00s"
    )


@pytest.mark.parametrize(
    ("report_to", "expected"),
    [
        ("none", []),
        ("tensorboard", ["tensorboard"]),
        (" tensorboard , none ", ["tensorboard", "none"]),
    ],
)
def test_trackers_read_a_comma_separated_list(report_to: str, expected: list[str]) -> None:
    assert trackers(report_to) == expected


@pytest.mark.parametrize(
    ("report_to", "problem"),
    [
        ("nowhere", "report_to 'nowhere' is not a tracker"),
        ("trackio,nowhere", "report_to"),
    ],
)
def test_unknown_or_missing_trackers_are_refused(report_to: str, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        check_report_to(report_to)


def test_a_lora_run_is_merged_from_its_saved_adapter_as_the_live_model_would_be(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """final/ of a LoRA run merges the adapter the trainer saved (gathered, under ZeRO-3)
    into base weights read anew: the weights of merging the live model, which is left
    as it trained (ZeRO-3's partitioned parameters could not be merged in place)."""
    import copy

    import torch
    from peft import get_peft_model
    from safetensors.torch import load_file
    from transformers import Trainer, TrainingArguments

    from collabrl.models import load_model, load_tokenizer

    torch.manual_seed(0)
    lora = LoraSettings(True, r=4)
    peft_config = lora.peft_config()
    peft_config.init_lora_weights = False  # a random B: merging changes the weights
    model = get_peft_model(load_model(str(tiny_model_dir)), peft_config)
    live_merge = copy.deepcopy(model).merge_and_unload().state_dict()
    args = TrainingArguments(str(tmp_path / "checkpoints"), use_cpu=True, report_to=[])
    trainer = Trainer(model=model, args=args, processing_class=load_tokenizer(str(tiny_model_dir)))
    save_final(trainer, tmp_path / "final", lora)
    merged = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert merged.keys() <= live_merge.keys() and "model.norm.weight" in merged
    for name, weight in merged.items():
        torch.testing.assert_close(weight, live_merge[name], msg=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "final"]
    assert any("lora_B" in name for name, _ in trainer.model.named_parameters())
