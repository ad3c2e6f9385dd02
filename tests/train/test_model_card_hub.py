"""The model card's front matter as the Hub reads it: `base_model` and `license` for an
embedded model and for a hub name in the local cache, `datasets` for data copied from a
Hub dataset, `model-index` with the end-of-run held-out scores; and no stray TRL card in
checkpoints/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from collabrl.train.grpo import train_grpo
from collabrl.train.model_card import TrainingFacts, card_data, write_model_card
from collabrl.train.resolve import resolve_run
from collabrl.train.run import CHECKPOINTS, FINAL
from collabrl.train.sft import train_sft
from tests.test_models_hub_cache import REPO, fake_hub_cache
from tests.train.test_grpo import _config
from tests.train.test_sft import ROW
from tests.train.test_sft import _config as sft_config

START = {"pass@1": 0.25, "call_ratio": 0.0, "mean_completion_tokens": 40.0, "problems": 4}
FINAL_SCORES = {"pass@1": 0.5, "call_ratio": 0.125, "mean_completion_tokens": 31.0}
PAIRED = {"gained": 1, "lost": 0, "p_value": 1.0}


def _facts(base_model: str = "smollm2-135m", **changes) -> TrainingFacts:
    fields = {"base_model": base_model, "method": "relay", "data": "arith_train"}
    return TrainingFacts(**(fields | {"rows": 8, "steps": 2, "settings": {}} | changes))


def _evaluated(**changes) -> TrainingFacts:
    evaluation = {"start": START, "final": FINAL_SCORES, "paired": PAIRED}
    return _facts(**({"eval_data": "math500", "evaluation": evaluation} | changes))


def test_the_embedded_model_names_its_hub_repo_and_license() -> None:
    data = card_data(_facts("smollm2-135m"))
    assert data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert data.license == "apache-2.0"


def test_a_cached_hub_model_lends_its_license_from_its_snapshot(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "README.md").write_text("---\nlicense: mit\n---\n# a hub model\n")
    snapshot = fake_hub_cache(tmp_path / "hub", REPO, model)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    pinned = f"{REPO}@{snapshot.name}"
    data = card_data(_facts(pinned))
    assert (data.base_model, data.license) == (REPO, "mit")
    final = tmp_path / "final"
    final.mkdir()
    card = write_model_card(final, _facts(pinned)).read_text()
    assert f"- Base model: `{pinned}`" in card  # the commit it was trained from
    assert "\n# tiny-llama · collabrl relay\n" in card  # its name, without the commit


@pytest.mark.parametrize(
    ("data", "datasets"),
    [("dapo_math_17k", ["BytedTsinghua-SIA/DAPO-Math-17k"]), ("gsm8k_train", ["openai/gsm8k"])],
)
def test_data_copied_from_a_hub_dataset_is_named_by_its_id(data: str, datasets: list) -> None:
    assert card_data(_facts(data=data)).datasets == datasets


def test_generated_or_local_data_names_no_hub_dataset(tmp_path: Path) -> None:
    final = tmp_path / "final"
    final.mkdir()
    card = ModelCard.load(write_model_card(final, _facts(data="arith_train")))
    assert "datasets" not in card.data.to_dict()  # the body names it
    assert card_data(_facts(data=str(tmp_path / "rows.jsonl"))).datasets is None


def test_the_model_index_holds_the_trained_models_held_out_scores(tmp_path: Path) -> None:
    final = tmp_path / "final"
    final.mkdir()
    path = write_model_card(final, _evaluated())
    card = ModelCard.load(path)  # huggingface_hub parses the model-index back
    assert card.data.model_name == "smollm2-135m · collabrl relay"
    scores = {r.metric_type: r for r in card.data.eval_results}
    assert sorted(scores) == ["call_ratio", "pass@1"]  # scores, not the answers' length
    assert scores["pass@1"].metric_value == 0.5 and scores["call_ratio"].metric_value == 0.125
    assert scores["pass@1"].metric_name == "pass@1 (greedy)"
    result = scores["pass@1"]
    assert (result.task_type, result.dataset_type, result.dataset_name) == (
        "text-generation",
        "HuggingFaceH4/MATH-500",
        "math500",
    )
    index = card.data.to_dict()["model-index"]
    assert index[0]["results"][0]["dataset"]["type"] == "HuggingFaceH4/MATH-500"


def test_a_run_that_evaluated_nothing_has_no_model_index(tmp_path: Path) -> None:
    final = tmp_path / "final"
    final.mkdir()
    assert "model-index" not in write_model_card(final, _facts()).read_text()
    other = card_data(_evaluated(eval_data="./held-out.jsonl"))
    assert other.eval_results[0].dataset_type == "./held-out.jsonl"  # no Hub id known


def test_an_sft_run_leaves_no_trl_card_in_its_checkpoints(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Before, TRL wrote checkpoints/README.md at every save, its fields `[None]`."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({**ROW, "item_id": f"a{i}"}) + "\n" for i in range(2)))
    config = sft_config(tiny_model_dir, rows, tmp_path / "run", "max_steps=1", save_steps=1)
    out = train_sft(config).out_dir
    assert list((out / CHECKPOINTS).glob("checkpoint-*"))  # it saved
    assert not (out / CHECKPOINTS / "README.md").exists()
    assert (out / FINAL / "README.md").is_file()


def test_a_grpo_run_leaves_no_trl_card_in_its_checkpoints(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, steps=1, limit=2)))
    assert list((tmp_path / CHECKPOINTS).glob("checkpoint-*"))  # it saved
    assert not (tmp_path / CHECKPOINTS / "README.md").exists()
    assert (tmp_path / FINAL / "README.md").is_file()
