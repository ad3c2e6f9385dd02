"""The `reference` stand-in's reply: the cleaned solution and the boxed answer, cut to n tokens."""

from __future__ import annotations

import pytest

from collabrl.data.benchmarks import load_benchmark
from collabrl.engines.reference import (
    Reference,
    knows,
    near_miss,
    reference_completion,
    reference_text,
    stand_in_accuracy,
    stand_in_description,
)
from collabrl.errors import UserError
from collabrl.rewards.extract import extract_answer

GSM8K = "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nSo she earned $<<0.2*50=10>>10.\n#### 10"


def test_answer_only_reply_is_the_boxed_answer() -> None:
    assert reference_text(Reference("42")) == "The final answer is $\\boxed{42}$."


def test_gsm8k_markup_is_stripped_from_the_solution() -> None:
    text = reference_text(Reference("10", GSM8K))
    assert text == (
        "Weng earns 12/60 = $0.2 per minute.\nSo she earned $10.\n\n"
        "The final answer is $\\boxed{10}$."
    )


def test_latex_shifts_are_not_calculator_annotations() -> None:
    assert reference_text(Reference("1", "$a << b$ and $c >> d$")).startswith("$a << b$ and")


def test_a_reply_that_fits_stops(smol_tokenizer) -> None:
    reference = Reference("18")
    completion = reference_completion(reference, 1000, smol_tokenizer)
    assert completion.text == reference_text(reference)
    assert completion.finish_reason == "stop"
    ids = smol_tokenizer(completion.text, add_special_tokens=False)["input_ids"]
    assert completion.token_ids == ids and completion.completion_tokens == len(ids)
    assert extract_answer(completion.text, ("boxed",)) == "18"


def test_a_reply_is_cut_at_n_tokens_of_the_tokenizer(smol_tokenizer) -> None:
    item = load_benchmark("gsm8k", limit=1).items[0]
    reference = Reference(item.answer, item.solution)
    full = smol_tokenizer(reference_text(reference), add_special_tokens=False)["input_ids"]
    for n in (1, 3, len(full) - 1):
        completion = reference_completion(reference, n, smol_tokenizer)
        assert completion.token_ids == full[:n] and completion.completion_tokens == n
        assert completion.finish_reason == "length"
        assert completion.text == smol_tokenizer.decode(full[:n], skip_special_tokens=True)
    exact = reference_completion(reference, len(full), smol_tokenizer)
    assert exact.finish_reason == "stop" and exact.completion_tokens == len(full)


def test_every_call_starts_from_the_beginning(smol_tokenizer) -> None:
    reference = Reference("7", "First step.\nSecond step.")
    first = reference_completion(reference, 2, smol_tokenizer)
    assert reference_completion(reference, 2, smol_tokenizer) == first
    assert reference_completion(reference, 5, smol_tokenizer).text.startswith(first.text)


# --- reference@P: the fallible stand-in -----------------------------------------------------------


def test_a_stand_in_is_named_with_its_accuracy() -> None:
    assert stand_in_accuracy("reference") == 1.0
    assert stand_in_accuracy("reference@0.7") == 0.7
    assert stand_in_accuracy("reference@0") == 0.0
    assert stand_in_accuracy("./reference") is None and stand_in_accuracy("smollm2-135m") is None
    for bad in ("reference@1.5", "reference@x", "reference@", "reference@nan"):
        with pytest.raises(UserError, match="a stand-in's accuracy is a number from 0 to 1"):
            stand_in_accuracy(bad)


def test_the_dry_run_says_what_each_stand_in_replies() -> None:
    assert "the gold answer, right on 70%" in stand_in_description("reference@0.7")
    assert "a worked solution, right on 70%" in stand_in_description("reference-solution@0.7")
    assert "next tokens, right on 100%" in stand_in_description("reference-continue")
    assert stand_in_description("smollm2-135m") is None


def test_a_fallible_stand_in_knows_its_share_of_problems_and_always_the_same_ones() -> None:
    references = [Reference(str(i), key=f"item-{i}") for i in range(4000)]
    known = [knows(r, 0.7) for r in references]
    assert abs(sum(known) / len(known) - 0.7) < 0.03
    assert known == [knows(r, 0.7) for r in references]  # a draw per problem, not per call
    assert all(knows(r, 1.0) for r in references) and not any(knows(r, 0.0) for r in references)


def test_a_problem_it_does_not_know_gets_a_near_miss_without_the_solution(smol_tokenizer) -> None:
    reference = Reference("47", "Forty and seven.", key="arith-test-add2-0001")
    completion = reference_completion(reference, 1000, smol_tokenizer, accuracy=0.0)
    answer = extract_answer(completion.text, ("boxed",))
    assert answer is not None and 1 <= int(answer) - 47 <= 9
    assert "Forty" not in completion.text
    assert reference_completion(reference, 1000, smol_tokenizer, accuracy=0.0) == completion
    right = reference_completion(reference, 1000, smol_tokenizer, accuracy=1.0)
    assert extract_answer(right.text, ("boxed",)) == "47"
    assert near_miss(Reference("\\frac{1}{2}", key="k")).answer.startswith("\\frac{1}{2}+")


@pytest.mark.parametrize("ref", ["Reference", "REFERENCE", "Reference@0.5", "REFERENCE@x"])
def test_the_stand_in_in_another_casing_is_refused_not_taken_for_a_model(ref: str) -> None:
    with pytest.raises(UserError, match=f"write {ref.lower()}$"):
        stand_in_accuracy(ref)
    assert stand_in_accuracy("references/teacher") is None  # a model path that starts alike
