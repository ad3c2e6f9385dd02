"""scripts/evidence/docs_qa.py: questions answered in the documentation corpus, kept only
when the retrieve tool shows the answer, graded right, split by function, deterministic.
The stdlib family keeps these fast (its pydoc pages index in well under a second); the
tool and the grader are the real ones."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from collabrl.data.benchmarks import load_benchmark
from collabrl.rewards.verify import is_equivalent
from collabrl.tools.retrieval import RetrievalTool
from tests.eval.evidence import load_script


@pytest.fixture(scope="module")
def docs_qa():
    return load_script("docs_qa")


@pytest.fixture(scope="module")
def rows(docs_qa, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLLABRL_HOME", str(home))
        generated, tried = docs_qa.generate(10, 10, seed=2, families=("stdlib",))
    return generated, tried


def _near_miss(answer: str) -> str:
    """A wrong answer a careless reader might write: the next value, or another word."""
    words = {"\\text{None}": "0", "\\text{True}": "False", "\\text{False}": "True"}
    if answer in words:
        return words[answer]
    if answer.startswith("\\text{"):
        return answer[6:-1] + "s"
    if "e" in answer:  # 1e-09 -> 2e-09
        mantissa, exponent = answer.split("e")
        return f"{float(mantissa) * 2:g}e{exponent}"
    return str(Fraction(answer) + 1)


def test_kept_questions_are_graded_right_and_not_answered_in_the_question(rows) -> None:
    generated, tried = rows
    asked, kept = tried["stdlib"]
    assert 0 < kept <= asked
    every = generated["train"] + generated["test"]
    assert len(every) == kept and {r["answer_type"] for r in every} == {"math", "number"}
    for row in every:
        answer, kind = row["answer"], row["answer_type"]
        assert is_equivalent(answer, answer, answer_type=kind)
        assert not is_equivalent(_near_miss(answer), answer, answer_type=kind), row
        assert answer.removeprefix("\\text{").removesuffix("}") not in row["problem"]
    # math.isclose's rel_tol as the docs write it: exponent form, graded as math.
    [isclose] = [
        r for r in every if r["function"].endswith("isclose") and "rel_tol" in r["problem"]
    ]
    assert (isclose["answer"], isclose["answer_type"]) == ("1e-09", "math")
    assert is_equivalent("1e-9", "1e-09") and not is_equivalent("1e-08", "1e-09")


def test_the_retrieve_tool_shows_every_kept_answer(docs_qa, rows, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path))
    tool = RetrievalTool(docs_qa.ApolloConfig().retrieval)
    generated, _ = rows
    for row in generated["train"] + generated["test"]:
        shown = tool.call({"repo_name": row["repo"], "query": row["problem"]}).text
        spelled = [w for w in shown.replace("(", " ").replace(",", " ").split() if "=" in w]
        values = [w.split("=", 1)[1].rstrip(")") for w in spelled]
        assert any(is_equivalent(v, row["answer"], answer_type=row["answer_type"]) for v in values)


def test_splits_share_no_function_and_the_seed_fixes_them(
    docs_qa, rows, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path))
    generated, _ = rows
    short = {
        split: {r["function"].rsplit(".", 1)[1] for r in kept} for split, kept in generated.items()
    }
    assert short["train"] and short["test"] and not short["train"] & short["test"]
    again, _ = docs_qa.generate(10, 10, seed=2, families=("stdlib",))
    assert again == generated
    other, _ = docs_qa.generate(10, 10, seed=1, families=("stdlib",))
    assert other != generated
    # The worked retrieve call of the warm-up prompt answers no question.
    assert all(
        "limit_denominator" not in r["problem"] for r in generated["train"] + generated["test"]
    )


def test_the_files_load_as_a_benchmark_with_families_in_the_ids(
    docs_qa, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path / "home"))
    docs_qa.main(["3", "3", str(tmp_path / "out"), "--families", "stdlib", "--seed", "2"])
    lines = (tmp_path / "out" / "test.jsonl").read_text().splitlines()
    assert all(json.loads(line)["id"].startswith("docs-test-stdlib-") for line in lines)
    bench = load_benchmark(str(tmp_path / "out" / "test.jsonl"))
    assert [item.answer_type for item in bench.items] == [
        json.loads(line)["answer_type"] for line in lines
    ]
