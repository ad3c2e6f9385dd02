"""Tests for decontaminating training rows against the evaluation benchmarks."""

from __future__ import annotations

import pytest

from collabrl.builders.decontaminate import (
    NGRAM,
    Decontamination,
    decontaminate,
    evaluation_sets,
    ngrams,
    normalise,
    words,
)
from collabrl.data.benchmarks import Item, data_dir, load_benchmark, registry


@pytest.fixture(scope="module")
def evals() -> dict[str, list[Item]]:
    return evaluation_sets()


def _by_id(items: list[Item]) -> dict[str, Item]:
    return {item.id: item for item in items}


def test_evaluation_sets_are_the_registry_without_training_sets(
    evals: dict[str, list[Item]],
) -> None:
    assert list(evals) == [name for name, spec in registry().items() if spec.split != "train"]
    assert "arith" in evals and "math_train" not in evals
    assert len(evals["math500"]) == 500


def test_normalise_drops_case_spacing_and_punctuation_but_keeps_operators() -> None:
    assert normalise("What  is\n$8 + 6$?") == normalise("what is 8\\,+\\;6.") == "what is 8 + 6"
    assert normalise("What is 8 + 6?") != normalise("What is 8 - 6?")
    assert normalise("Find $x$. [asy]draw((0,0)--(1,1));[/asy]") == "find x"
    assert words("Let $x^2 + 1 = \\frac{1}{2}$.") == ["let", "x", "2", "1", "frac", "1", "2"]


def test_planted_duplicates_are_dropped_with_their_benchmark_and_kind(
    evals: dict[str, list[Item]],
) -> None:
    math = _by_id(evals["math500"])
    gsm = _by_id(evals["gsm8k"])
    verbatim = math["test/precalculus/807.json"]
    reformatted = gsm[evals["gsm8k"][0].id]
    embedded_from = gsm[evals["gsm8k"][1].id]
    twelve_from = gsm[evals["gsm8k"][2].id]
    thirteen = " ".join(words(embedded_from.problem)[:NGRAM])
    twelve = " ".join(words(twelve_from.problem)[: NGRAM - 1])
    planted = [
        Item("verbatim", verbatim.problem, verbatim.answer),
        Item("reformatted", "  " + reformatted.problem.upper().replace(" ", " \n\t "), "1"),
        Item("embedded", f"Zoe read this first: {thirteen}. How many zebras are blue?", "2"),
        Item("twelve", f"Zoe read this first: {twelve}. How many zebras are blue?", "3"),
        Item("clean-1", "What is 17 + 25? Put your final answer within \\boxed{}.", "42"),
        Item("clean-2", "A train leaves at noon and travels 60 miles per hour for 3 hours.", "180"),
    ]

    result = decontaminate(planted, evals)

    assert [(d.item.id, d.benchmark, d.how, d.eval_id) for d in result.dropped] == [
        ("verbatim", "math500", "exact", verbatim.id),
        ("reformatted", "gsm8k", "exact", reformatted.id),
        ("embedded", "gsm8k", "ngram", embedded_from.id),
    ]
    assert [item.id for item in result.kept] == ["twelve", "clean-1", "clean-2"]
    counts = result.counts()
    assert set(counts) == set(evals)
    assert counts["math500"] == {"exact": 1, "ngram": 0}
    assert counts["gsm8k"] == {"exact": 1, "ngram": 1}
    assert (
        sum(sum(c.values()) for name, c in counts.items() if name not in ("math500", "gsm8k")) == 0
    )


def test_a_problem_shorter_than_n_words_matches_only_exactly() -> None:
    against = {"tiny": [Item("t", "What is 8 + 6? Put your final answer within \\boxed{}.", "14")]}
    rows = [
        Item("same", "what is 8 + 6 ? put your final answer within \\boxed{}", "14"),
        Item("other", "What is 8 - 6? Put your final answer within \\boxed{}.", "2"),
    ]
    result = decontaminate(rows, against)
    assert [(d.item.id, d.how) for d in result.dropped] == [("same", "exact")]
    assert [item.id for item in result.kept] == ["other"]


def test_phrasing_shared_by_two_evaluation_problems_drops_nothing() -> None:
    phrase = "where m and n are relatively prime positive integers find the value of m plus n"
    against = {
        "b": [
            Item("1", f"A circle has area m/n {phrase}", "1"),
            Item("2", f"Two dice give m/n {phrase}", "2"),
        ]
    }
    result = decontaminate([Item("t", f"A square has side m/n {phrase}", "3")], against)
    assert result.dropped == []


@pytest.mark.parametrize("file", ["math_train.jsonl", "gsm8k_train.jsonl"])
def test_shipped_training_sets_run_and_every_drop_is_backed_by_its_match(
    file: str, evals: dict[str, list[Item]]
) -> None:
    items = load_benchmark(str(data_dir() / file)).items
    result: Decontamination = decontaminate(items, evals)
    assert len(result.kept) + len(result.dropped) == len(items)
    assert sum(sum(c.values()) for c in result.counts().values()) == len(result.dropped)
    # Check each drop independently of the index: the named evaluation problem really
    # equals the row after normalising, or really shares a 13-gram with it.
    for drop in result.dropped:
        source = _by_id(evals[drop.benchmark])[drop.eval_id]
        if drop.how == "exact":
            assert normalise(drop.item.problem) == normalise(source.problem)
        else:
            shared = set(ngrams(words(drop.item.problem), NGRAM))
            assert shared & set(ngrams(words(source.problem), NGRAM)), drop.item.id
