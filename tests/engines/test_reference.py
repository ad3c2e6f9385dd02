"""The `reference` stand-in's reply: the cleaned solution and the boxed answer, cut to n tokens."""

from __future__ import annotations

from collabrl.data.benchmarks import load_benchmark
from collabrl.engines.reference import Reference, reference_completion, reference_text
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
