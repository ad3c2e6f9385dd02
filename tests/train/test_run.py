"""Tests for the pieces every trainer shares: the line a step reports (train/run.py),
the experiment trackers a run may report to (train/trackers.py), and the final model a
LoRA run saves."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl.errors import UserError
from collabrl.train.checkpoints import last_checkpoint
from collabrl.train.final import save_final
from collabrl.train.lora import LoraSettings
from collabrl.train.run import keep_metrics_until, step_line
from collabrl.train.trackers import check_report_to, trackers


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


# --- a broken checkpoint is named before any work, with the sound one before it (issue 33) -----


def write_checkpoint(checkpoints: Path, step: int) -> Path:
    """A checkpoint folder as TRL saves one, in miniature: state, weights, optimizer."""
    import torch
    from safetensors.torch import save_file

    folder = checkpoints / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(f'{{"global_step": {step}, "log_history": []}}')
    save_file({"w": torch.zeros(64)}, str(folder / "model.safetensors"))
    torch.save({"state": {0: torch.zeros(64)}}, folder / "optimizer.pt")
    return folder


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda f: (f / "trainer_state.json").write_text('{"global_st'), "is not valid JSON"),
        (lambda f: (f / "trainer_state.json").write_text("[]"), "holds no global_step"),
        (lambda f: (f / "trainer_state.json").unlink(), "No such file"),
        (lambda f: cut(f / "model.safetensors"), "model.safetensors is cut short"),
        (lambda f: (f / "model.safetensors").write_bytes(b"\0" * 64), "model.safetensors is cut"),
        (lambda f: cut(f / "optimizer.pt"), "optimizer.pt is cut short"),
        (lambda f: (f / "optimizer.pt").write_text("not torch"), "optimizer.pt is cut short"),
    ],
    ids=["torn state", "state not ours", "no state", "cut weights", "zeroed weights",
         "cut optimizer", "garbage optimizer"],
)  # fmt: skip
def test_a_broken_last_checkpoint_is_named_with_the_one_before_it(
    tmp_path: Path, damage, problem: str
) -> None:
    write_checkpoint(tmp_path, 5)
    broken = write_checkpoint(tmp_path, 10)
    assert last_checkpoint(tmp_path, resume=True) == str(broken)  # sound, it is taken
    damage(broken)

    with pytest.raises(UserError) as refused:
        last_checkpoint(tmp_path, resume=True)

    assert f"checkpoint {broken} is broken: " in refused.value.problem
    assert problem in refused.value.problem
    assert (
        refused.value.fix
        == f"move or delete {broken} to resume from checkpoint-5, the one before it"
    )


def test_a_broken_only_checkpoint_says_to_start_over(tmp_path: Path) -> None:
    broken = write_checkpoint(tmp_path, 3)
    write_checkpoint(tmp_path, 1)
    cut(tmp_path / "checkpoint-1" / "optimizer.pt")  # the one before is broken too
    (broken / "trainer_state.json").write_text("")
    with pytest.raises(UserError, match="run without --resume, or use a new --out folder"):
        last_checkpoint(tmp_path, resume=True)


def test_rewinding_the_metrics_ignores_a_rewrite_cut_short_earlier(tmp_path: Path) -> None:
    """A temporary file a crash left behind (metrics.tmp, as rewrites named theirs before
    `runs.replacing`) is never appended to: the dropped steps' logs must not come back."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    path.with_suffix(".tmp").write_text('{"step": 9}\n')
    keep_metrics_until(path, 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_curves_leave_out_zeros_throughout_and_what_is_no_number(tmp_path: Path) -> None:
    """One rule for train_curves.png and the run page (`curves_figure`): a key logged as
    zeros throughout is no panel; a NaN, a string or a bool is no point."""
    from collabrl.train.run import curve_keys, plot_curves, series

    history = [
        {"step": 1, "reward": 0.0, "episodes/calls": 0, "loss": float("nan")},
        {"step": 2, "reward": 0.5, "episodes/calls": 0.0, "loss": "high", "x": True},
        {"step": "3", "reward": 1.0},  # no step number: no point
    ]
    keys = ("reward", "episodes/calls", "loss", "x", "absent")
    assert curve_keys(history, keys) == ["reward"]
    assert series(history, "reward") == [(1.0, 0.0), (2.0, 0.5)]
    png = tmp_path / "train_curves.png"
    plot_curves(history, png, keys, "grpo · m on arith")
    assert png.read_bytes().startswith(b"\x89PNG")
    plot_curves(history, tmp_path / "none.png", ("episodes/calls",), "no panel")
    assert not (tmp_path / "none.png").exists()
