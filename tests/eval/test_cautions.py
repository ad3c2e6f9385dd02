"""The checks behind the warnings where a user is about to fool themselves (issue 35):
test-split problems, a stand-in collaborator, a call protocol on an un-warmed policy.
Each fires when it should and stays silent when it should not; the commands that print
them are tested in tests/cli/test_cautions_command.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from collabrl import runs
from collabrl.data.benchmarks import data_dir
from collabrl.engines.reference import STAND_IN_NOTE
from collabrl.eval.cautions import split_warning, stand_in_warning, unwarmed_call_warning
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.consult_config import ConsultConfig
from collabrl.protocols.relay_config import RelayConfig

RELAY = ProtocolConfig(name="relay", teacher="reference")
CONSULT = ProtocolConfig(name="consult", experts=["reference"], consult=ConsultConfig(mode="open"))


def _run_folder(path: Path, **config: object) -> Path:
    """A run folder as collabrl writes one: its config.yaml, and rows.jsonl."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(runs.provenance() + yaml.safe_dump(config))
    (path / "rows.jsonl").write_text('{"id": "1", "problem": "1 + 1", "answer": "2"}\n')
    return path


def _model(folder: Path) -> Path:
    """A Hugging Face model folder as resolve_model recognises one: a whole safetensors
    file (a cut-short one is refused), of one tiny tensor."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(
    ("data", "fix"),
    [
        ("arith", "use arith_train"),
        ("arith4", "use arith4_train"),
        ("aime24", "use a training set (arith_train, "),
        (str(data_dir() / "arith_test.jsonl"), "use arith_train"),
    ],
)
def test_a_benchmarks_test_split_is_named_with_its_training_set(data: str, fix: str) -> None:
    warning = split_warning(data)
    assert warning is not None and warning.startswith(f"training on '{data}'")
    assert "held-out scores are no longer held out" in warning and fix in warning


@pytest.mark.parametrize(
    "data", ["arith_train", "dapo_math_17k", str(data_dir() / "arith_train.jsonl")]
)
def test_a_training_split_is_not_warned(data: str) -> None:
    assert split_warning(data) is None


def test_a_folder_built_from_a_test_split_is_followed_back(tmp_path: Path) -> None:
    filtered = _run_folder(tmp_path / "filter", data="arith")
    # A warm-up built on the filter's rows: two run folders back to the benchmark.
    warmup = _run_folder(tmp_path / "warmup", data=str(filtered / "rows.jsonl"))

    for data in (filtered, filtered / "rows.jsonl", warmup):
        warning = split_warning(str(data), "SFT on")
        assert warning is not None and "the test split of the benchmark 'arith'" in warning
    assert f"made from 'arith', {filtered / 'config.yaml'}" in (split_warning(str(warmup)) or "")
    clean = _run_folder(tmp_path / "clean", data="arith_train")
    assert split_warning(str(clean / "rows.jsonl")) is None


def test_run_folders_naming_each_other_end(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _run_folder(a, data=str(b))
    _run_folder(b, data=str(a))
    assert split_warning(str(a)) is None


def test_a_plain_data_file_is_not_warned(tmp_path: Path) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"id": "1", "problem": "1 + 1", "answer": "2"}\n')
    assert split_warning(str(mine)) is None
    # Beside a config.yaml of the user's own, not one a collabrl run wrote.
    (tmp_path / "config.yaml").write_text("data: arith\n")
    assert split_warning(str(mine)) is None
    assert split_warning(str(tmp_path / "absent.jsonl")) is None


@pytest.mark.parametrize("teacher", ["reference", "reference@0.5"])
def test_a_stand_in_teacher_or_expert_is_warned(teacher: str) -> None:
    assert stand_in_warning(dataclasses.replace(RELAY, teacher=teacher)) == STAND_IN_NOTE
    assert stand_in_warning(CONSULT) == STAND_IN_NOTE


def test_a_model_collaborator_or_a_teacher_free_run_is_not_a_stand_in(tmp_path: Path) -> None:
    teacher = str(_model(tmp_path / "teacher"))
    assert stand_in_warning(dataclasses.replace(RELAY, teacher=teacher)) is None
    # Teacher-free: the teacher is never asked, so the gold answer is never read.
    assert (
        stand_in_warning(dataclasses.replace(RELAY, relay=RelayConfig(teacher_free=True))) is None
    )
    assert stand_in_warning(ProtocolConfig()) is None


@pytest.mark.parametrize(
    ("protocol", "call"), [(RELAY, "<call>n</call>"), (CONSULT, "<agent_calls>")]
)
def test_a_base_model_on_a_call_protocol_is_warned(
    protocol: ProtocolConfig, call: str, tmp_path: Path
) -> None:
    for policy in ("smollm2-135m", str(_model(tmp_path / "Qwen3-1.7B"))):
        warning = unwarmed_call_warning(policy, protocol)
        assert warning is not None and f"'{policy}' was not warmed up on" in warning
        assert call in warning and f"collab build-warmup {protocol.name}" in warning


def test_a_warmed_up_policy_is_not_warned(tmp_path: Path) -> None:
    sft = _run_folder(tmp_path / "sft", model="smollm2-135m", epochs=1.0)
    relay = _run_folder(tmp_path / "relay", method="relay", protocol={"name": "relay"})
    warmed = [
        _model(sft / "final"),
        _model(sft / "checkpoints" / "checkpoint-3"),
        _model(relay / "final"),  # RL on relay, continued
    ]
    for policy in warmed:
        assert unwarmed_call_warning(str(policy), RELAY) is None


def test_a_policy_trained_on_another_protocol_is_warned(tmp_path: Path) -> None:
    grpo = _run_folder(tmp_path / "grpo", method="grpo", protocol={"name": "solo"})
    assert unwarmed_call_warning(str(_model(grpo / "final")), RELAY) is not None


def test_no_call_no_warning(tmp_path: Path) -> None:
    for protocol in (
        ProtocolConfig(),  # solo
        ProtocolConfig(name="strategy"),
        dataclasses.replace(RELAY, relay=RelayConfig(teacher_free=True)),
        dataclasses.replace(CONSULT, consult=ConsultConfig(mode="locked")),
    ):
        assert unwarmed_call_warning("smollm2-135m", protocol) is None
    # A policy on another machine (a dry run for a cluster) is not judged.
    assert unwarmed_call_warning(str(tmp_path / "cluster" / "final"), RELAY) is None
