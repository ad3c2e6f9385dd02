"""`reference-solution@P`: the stand-in expert whose reply is a worked solution on every
problem, right on a share P of them (the draw `reference@P` makes) and slipped to a near
miss on the rest; served by the expert pool and cut to the tokens it is asked for."""

from __future__ import annotations

import pytest

from collabrl.config import PoolConfig
from collabrl.engines.base import SamplingParams
from collabrl.engines.calls import Call
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import (
    Reference,
    is_stand_in,
    knows,
    reference_completion,
    reference_text,
    slipped,
    stand_in_accuracy,
    stand_in_continues,
    stand_in_teaches,
)
from collabrl.errors import UserError
from collabrl.rewards.extract import extract_answer

WORKED = "36 × 15 = 36 × 10 + 36 × 5\n= 360 + 180\n= 540"
ITEM = Reference("540", WORKED, key="arith-train-mul22-0003")
GSM8K = "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nSo she earned $<<0.2*50=10>>10.\n#### 10"


def _boxed(text: str) -> str | None:
    return extract_answer(text, ("boxed",))


def test_the_teaching_stand_in_has_its_own_spelling() -> None:
    assert stand_in_accuracy("reference-solution") == 1.0
    assert stand_in_accuracy("reference-solution@0.7") == 0.7
    assert is_stand_in("reference-solution@0.7")
    assert stand_in_teaches("reference-solution@0.7") and stand_in_teaches("reference-solution")
    assert not stand_in_continues("reference-solution@0.7")
    # Every other spelling keeps its bare near misses.
    for ref in ("reference", "reference@0.7", "reference-continue@0.7", "smollm2-135m"):
        assert not stand_in_teaches(ref)
    with pytest.raises(UserError, match="write e.g. reference-solution@0.7"):
        stand_in_accuracy("reference-solution@2")
    with pytest.raises(UserError, match="written in lower case"):
        stand_in_accuracy("Reference-Solution@0.7")


def test_it_is_right_on_its_share_of_problems_by_the_draw_of_reference_at_p(
    smol_tokenizer,
) -> None:
    references = [Reference(str(100 + i), f"{i} + 100\n= {100 + i}", f"k-{i}") for i in range(600)]
    answers = [
        _boxed(reference_completion(r, 200, smol_tokenizer, 0.7, teaches=True).text)
        for r in references
    ]
    right = [a == r.answer for a, r in zip(answers, references, strict=True)]
    assert abs(sum(right) / len(right) - 0.7) < 0.06
    # The same problems as `reference@0.7`: asking the teaching one again does not help.
    assert right == [knows(r, 0.7) for r in references]
    for answer, reference, ok in zip(answers, references, right, strict=True):
        assert ok or 1 <= int(answer) - int(reference.answer) <= 9


def test_a_right_reply_is_the_worked_solution_ending_in_the_answer(smol_tokenizer) -> None:
    completion = reference_completion(ITEM, 200, smol_tokenizer, 1.0, teaches=True)
    assert completion.text == reference_text(ITEM)
    assert completion.text.startswith(WORKED) and _boxed(completion.text) == "540"
    assert completion.finish_reason == "stop"


def test_a_wrong_reply_is_the_same_solution_with_its_last_step_slipped(smol_tokenizer) -> None:
    completion = reference_completion(ITEM, 200, smol_tokenizer, 0.0, teaches=True)
    wrong = _boxed(completion.text)
    assert wrong is not None and 1 <= int(wrong) - 540 <= 9
    # Every step but the last, unchanged; the last reaches the near miss, not 540.
    assert completion.text.startswith("36 × 15 = 36 × 10 + 36 × 5\n= 360 + 180\n")
    assert f"= {wrong}\n\nThe final answer is" in completion.text and "540" not in completion.text
    # `reference@P` on the same problem writes the near miss alone.
    bare = reference_completion(ITEM, 200, smol_tokenizer, 0.0)
    assert _boxed(bare.text) == wrong and "36 × 10" not in bare.text


@pytest.mark.parametrize(
    ("answer", "solution", "slip"),
    [
        # GSM8K's markup goes first, so the slip lands in the sentence that states it.
        ("10", GSM8K, "Weng earns 12/60 = $0.2 per minute.\nSo she earned ${}."),
        # The last statement only: an earlier 14 is a step on the way.
        ("-14", "91 - 77 = 14\nso 77 - 91 = -14", "91 - 77 = 14\nso 77 - 91 = {}"),
        # A number that only holds the answer's digits is not it.
        ("5", "7 - 2 = 5\nnot 15, 50, 0.5 or 5.5", "7 - 2 = {}\nnot 15, 50, 0.5 or 5.5"),
        # A solution that never states it keeps its steps.
        ("8", "Double four.", "Double four."),
    ],
)
def test_the_slip_rewrites_the_last_statement_of_the_answer(
    answer: str, solution: str, slip: str
) -> None:
    reference = Reference(answer, solution, key="slip")
    miss = slipped(reference)
    assert miss.answer != answer and miss.solution == slip.format(miss.answer)


def test_without_a_solution_the_reply_is_the_answer_alone(smol_tokenizer) -> None:
    bare = Reference("47", None, key="arith-test-add2-0001")
    right = reference_completion(bare, 200, smol_tokenizer, 1.0, teaches=True)
    assert right.text == "The final answer is $\\boxed{47}$."
    wrong = reference_completion(bare, 200, smol_tokenizer, 0.0, teaches=True)
    assert wrong == reference_completion(bare, 200, smol_tokenizer, 0.0)


def test_the_pool_serves_it_cut_to_the_tokens_asked_for(smol_tokenizer) -> None:
    """As `--expert reference-solution@P` in consult: the pool's reply, within the
    protocol's expert_max_tokens, is the start of the worked solution."""
    full = smol_tokenizer(reference_text(ITEM), add_special_tokens=False)["input_ids"]
    chat = [{"role": "user", "content": "What is 36 × 15?"}]
    config = PoolConfig(endpoints=["reference-solution@1"], num_experts=2)
    with ExpertPool(config, tokenizer=smol_tokenizer) as pool:
        cut, whole = pool.ask_each_sync(
            [Call(1, chat, ITEM), Call(2, chat, ITEM)],
            [SamplingParams(max_tokens=6), SamplingParams(max_tokens=len(full))],
        )
    assert cut.endpoint == "reference-solution@1 (stand-in)" and cut.outcome == "ok"
    assert (cut.completion_tokens, cut.finish_reason) == (6, "length")
    assert cut.text == smol_tokenizer.decode(full[:6]) and WORKED.startswith(cut.text)
    assert (whole.text, whole.finish_reason) == (reference_text(ITEM), "stop")
