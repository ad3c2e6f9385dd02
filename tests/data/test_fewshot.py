"""Few-shot examples (`--num-fewshot`): drawn from a benchmark's training split, fixed by
a seed, and shown in the format the prompt template asks for."""

from __future__ import annotations

import pytest

from collabrl.data.benchmarks import Item, fewshot_items, load_benchmark, registry
from collabrl.data.prompts import get_prompt
from collabrl.errors import UserError


def test_every_fewshot_source_is_a_training_split() -> None:
    sources = {spec.name: spec.fewshot for spec in registry().values() if spec.fewshot}
    assert {"gsm8k", "math500", "arith", "arith_steps", "arith4"} == set(sources)
    for name, source in sources.items():
        assert registry()[source].split == "train", name
        assert registry()[name].split == "test", name


def test_examples_are_fixed_by_their_seed_and_never_test_rows() -> None:
    bench = load_benchmark("gsm8k", limit=3)
    first = [item.id for item in fewshot_items(bench, 5, 1234)]
    assert first == [item.id for item in fewshot_items(bench, 5, 1234)]
    assert first != [item.id for item in fewshot_items(bench, 5, 1)]
    assert len(set(first)) == 5 and all(i.startswith("gsm8k-train-") for i in first)


@pytest.mark.parametrize("name", ["aime24", "minerva", "olympiadbench"])
def test_a_benchmark_without_a_training_split_is_refused(name: str) -> None:
    with pytest.raises(UserError) as info:
        fewshot_items(load_benchmark(name, limit=1), 2, 0)
    assert f"benchmark '{name}' has no training split" in info.value.problem
    assert "gsm8k" in info.value.fix


def test_more_examples_than_rows_is_refused() -> None:
    with pytest.raises(UserError, match="more than the 360 rows of arith_steps_train"):
        fewshot_items(load_benchmark("arith_steps"), 361, 0)


def test_a_gsm8k_reply_drops_its_annotations_and_ends_in_the_asked_format() -> None:
    solution = "She sold 48/2 = <<48/2=24>>24 in May.\n48+24 = <<48+24=72>>72\n#### 72"
    reply = get_prompt("relay").reply(solution, "72")
    assert reply == "She sold 48/2 = 24 in May.\n48+24 = 72\nThe final answer is $\\boxed{72}$."
    assert get_prompt("eapo-eval").reply(solution, "72").endswith("48+24 = 72\nAnswer: 72")


def test_a_reply_that_states_its_answer_as_asked_is_kept_whole() -> None:
    solution = "Add them: $1 + 1 = \\boxed{2}$."
    assert get_prompt("relay").reply(solution, "2") == solution
    assert get_prompt("plain").reply(None, "6") == "The final answer is $\\boxed{6}$."


def test_examples_as_turns_or_in_one_turn() -> None:
    examples = [Item("a", "What is 1 + 1?", "2"), Item("b", "What is 2 + 2?", "4")]
    turns = get_prompt("relay").with_shots(examples, multiturn=True).messages("What is 3 + 3?")
    assert [m["role"] for m in turns] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert turns[1]["content"] == "What is 1 + 1?"
    assert turns[2]["content"] == "The final answer is $\\boxed{2}$."
    assert turns[-1]["content"] == "What is 3 + 3?"

    (system, user) = get_prompt("relay").with_shots(examples, multiturn=False).messages("3 + 3?")
    assert system["role"] == "system"
    assert user["content"] == (
        "What is 1 + 1?\nThe final answer is $\\boxed{2}$.\n\n"
        "What is 2 + 2?\nThe final answer is $\\boxed{4}$.\n\n3 + 3?"
    )
