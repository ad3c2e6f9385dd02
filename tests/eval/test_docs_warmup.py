"""scripts/evidence/docs_warmup.py: the rule writes docs_qa's checked call, the real
builder runs it through the real retrieve tool and keeps what shows the gold answer."""

from __future__ import annotations

import json

import pytest

from collabrl.builders.apollo_warmup import build_apollo_warmup
from collabrl.engines.base import SamplingParams
from collabrl.errors import UserError
from collabrl.rewards.verify import is_equivalent
from tests.eval.evidence import load_script


@pytest.fixture(scope="module")
def docs_warmup():
    return load_script("docs_warmup")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """COLLABRL_HOME, where the retrieve tool keeps its index: built once, for both uses."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def questions(home):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLLABRL_HOME", str(home))
        generated, _ = load_script("docs_qa").generate(10, 10, seed=2, families=("stdlib",))
    return generated["train"]


def test_every_question_gives_the_rule_call_and_the_answer_it_shows(
    docs_warmup, home, questions, smol_tokenizer, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("COLLABRL_HOME", str(home))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in questions))
    sets = ["apollo.tools=[retrieve]", "sampling.max_tokens=1024"]
    config = docs_warmup.warmup_config(str(data), str(tmp_path / "warmup"), sets)
    result = build_apollo_warmup(config, engine=docs_warmup.RuleCaller(smol_tokenizer))
    # docs_qa kept only questions this very call answers: every trace is kept.
    assert result.stats["traces"] == len(questions) > 0
    lines = [json.loads(line) for line in (result.out_dir / "rows.jsonl").read_text().splitlines()]
    by_id = {q["id"]: q for q in questions}
    for line in lines:
        question = by_id[line["item_id"]]
        call, answer = line["rows"]
        assert call["completion"] == docs_warmup.rule_call(question["problem"], question["repo"])
        assert "For example" not in call["prompt"]  # the aid-free prompt the policy trains on
        value = answer["completion"].removeprefix("The answer is \\boxed{").removesuffix("}.")
        assert is_equivalent(value, question["answer"], answer_type=question["answer_type"])


def test_a_prompt_without_a_question_is_refused(docs_warmup, smol_tokenizer) -> None:
    with pytest.raises(UserError, match="no docs_qa.py question"):
        docs_warmup.RuleCaller(smol_tokenizer).generate(["What is 2 + 2?"], SamplingParams())
