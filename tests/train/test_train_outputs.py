"""What a training run leaves behind and what it refuses: a model card in every final/,
the TRL settings a run cannot honour refused before anything loads, and a learning rate
that is constant where the docs say so (issue 35)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from collabrl.errors import UserError
from collabrl.protocols.config import ProtocolConfig
from collabrl.train.grpo import train_grpo
from collabrl.train.grpo_args import check_run, grpo_args
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.methods import registry as methods
from collabrl.train.model_card import TrainingFacts, card_data, write_model_card
from collabrl.train.resolve import resolve_run
from collabrl.train.run import FINAL, METRICS, REFUSED_TRL_KEYS
from collabrl.train.sft import SFTTrainConfig, train_sft
from tests.cli.test_cli import assert_one_line_error, collab
from tests.train.test_grpo import _config
from tests.train.test_sft import ROW
from tests.train.test_sft import _config as sft_config


def _front_matter(card: Path) -> tuple[dict, str]:
    _, head, body = card.read_text().split("---\n", 2)
    return yaml.safe_load(head), body


# --- settings a run cannot honour ---------------------------------------------------------


def test_push_to_hub_is_refused_by_the_dry_run_in_one_line(tmp_path: Path) -> None:
    args = ["train", "relay", "--teacher", "reference", "--dry-run", "--out", "run"]
    result = collab(*args, "--set", "trl.push_to_hub=true", cwd=tmp_path)
    assert_one_line_error(result, "trl.push_to_hub is not honoured", "hf upload")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key", sorted(REFUSED_TRL_KEYS))
def test_each_setting_a_run_cannot_honour_is_refused_before_any_model_loads(key: str) -> None:
    """check_run is what the dry run and `config show` call first; `collab train sft`
    checks its trl block the same way."""
    with pytest.raises(UserError, match=f"trl.{key} ") as err:
        check_run(GRPOTrainConfig(trl={key: True}))
    assert err.value.fix  # says what to do instead
    with pytest.raises(UserError, match=f"trl.{key} "):
        SFTTrainConfig(data="rows.jsonl", trl={key: True}).check()


# --- the learning-rate schedule -----------------------------------------------------------


@pytest.mark.parametrize("method", methods.grpo_names())
def test_the_learning_rate_is_constant_unless_the_trl_block_says_otherwise(
    method: str, tmp_path: Path
) -> None:
    assert grpo_args(GRPOTrainConfig(method=method), tmp_path).lr_scheduler_type == "constant"
    cosine = GRPOTrainConfig(method=method, trl={"lr_scheduler_type": "cosine"})
    assert grpo_args(cosine, tmp_path).lr_scheduler_type == "cosine"


def _relay(model: Path, out: Path, **changes) -> GRPOTrainConfig:
    relay = {"method": "relay", "protocol": ProtocolConfig(teacher="reference")}
    return _config(model, out, **(relay | changes))


def test_a_relay_run_logs_a_constant_rate_and_leaves_a_model_card_with_its_scores(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = train_grpo(
        resolve_run(_relay(tiny_model_dir, tmp_path, eval_data="arith", eval_limit=2))
    )
    logged = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    rates = [r["learning_rate"] for r in logged if "learning_rate" in r]
    assert rates == [1e-6, 1e-6]  # TRL's default would have decayed it: 1e-6, then 5e-7

    meta, body = _front_matter(tmp_path / FINAL / "README.md")
    assert meta["library_name"] == "transformers"
    assert {"collabrl", "grpo", "relay"} <= set(meta["tags"])
    assert "base_model" not in meta  # a local folder is no Hub id: named in the body
    assert f"Base model: `{tiny_model_dir}`" in body
    assert "Method: relay, protocol relay" in body and "Teacher: `reference`" in body
    assert "Data: `arith_train` (8 problems)" in body and "Steps: 2 optimizer steps" in body
    assert "| learning rate | 1e-06, constant schedule |" in body
    assert "| G (samples per problem, TRL num_generations) | 2 |" in body
    assert "| beta (KL) | 0.0 |" in body and "| max tokens per episode | 16 |" in body
    assert "| temperature | 1.0 |" in body and "| LoRA | off (all weights trained) |" in body
    start, final = result.evaluation["start"], result.evaluation["final"]
    assert f"| pass@1 | {start['pass@1']:.4f} | {final['pass@1']:.4f} |" in body
    assert "Of 2 problems:" in body
    assert "collabrl " in body and "AutoModelForCausalLM.from_pretrained" in body


def test_sft_leaves_a_model_card(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({**ROW, "item_id": f"a{i}"}) + "\n" for i in range(4)))
    config = sft_config(tiny_model_dir, rows, tmp_path / "run")
    result = train_sft(config)
    meta, body = _front_matter(result.out_dir / FINAL / "README.md")
    assert meta["library_name"] == "transformers" and {"collabrl", "sft"} <= set(meta["tags"])
    assert f"Data: `{rows}` (4 rows)" in body and "Steps: 2 optimizer steps" in body
    assert "| learning rate | 2e-05, linear schedule |" in body
    assert "| warm-up | 0.03 of the updates |" in body
    assert "No held-out evaluation ran" in body


# --- the card's front matter --------------------------------------------------------------


def _facts(base_model: str, **changes) -> TrainingFacts:
    fields = {"base_model": base_model, "method": "grpo", "data": "arith_train"}
    return TrainingFacts(**(fields | {"rows": 8, "steps": 2, "settings": {}} | changes))


def test_a_hub_id_is_the_cards_base_model_and_a_local_base_lends_its_license(
    tmp_path: Path,
) -> None:
    assert card_data(_facts("Qwen/Qwen3-1.7B")).base_model == "Qwen/Qwen3-1.7B"
    assert card_data(_facts("Qwen/Qwen3-1.7B@abc123")).base_model == "Qwen/Qwen3-1.7B"
    # The embedded model: the Hub repo its GGUF was quantized from.
    assert card_data(_facts("smollm2-135m")).base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: apache-2.0\n---\n# a model\n")
    data = card_data(_facts(str(base), adapter=True))
    assert data.base_model is None and data.license == "apache-2.0"
    assert data.library_name == "peft"  # final/ is the adapter alone
    final = tmp_path / "final"
    final.mkdir()
    meta, body = _front_matter(write_model_card(final, _facts(str(base), adapter=True)))
    assert meta["license"] == "apache-2.0" and "AutoPeftModelForCausalLM" in body
