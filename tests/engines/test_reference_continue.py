"""`reference-continue`: the stand-in that writes the next n tokens of a worked solution
from the point the partial answer has reached, and the worked solutions of the evidence
data it writes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl.config import PoolConfig
from collabrl.data.benchmarks import load_benchmark
from collabrl.engines.calls import Call
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import (
    Reference,
    reached,
    reference_completion,
    reference_text,
    stand_in_accuracy,
    stand_in_continues,
)
from collabrl.errors import UserError
from collabrl.rewards.extract import extract_answer
from tests.eval.evidence import load_script

WORKED = "64 × 25 = 64 × 20 + 64 × 5\n= 1280 + 320\n= 1600"
ITEM = Reference("1600", WORKED, key="mul22-0")
FIRST_STEP = "64 × 25 = 64 × 20 + 64 × 5"


def _tokens(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_continuing_stand_in_has_its_own_spelling() -> None:
    assert stand_in_accuracy("reference-continue") == 1.0
    assert stand_in_accuracy("reference-continue@0.7") == 0.7
    assert stand_in_continues("reference-continue@0.7") and stand_in_continues("reference-continue")
    # Every `reference@P` run keeps its meaning: it starts its reply at every call.
    assert not stand_in_continues("reference@0.7") and not stand_in_continues("smollm2-135m")
    with pytest.raises(UserError, match="write e.g. reference-continue@0.7"):
        stand_in_accuracy("reference-continue@2")
    with pytest.raises(UserError, match="written in lower case"):
        stand_in_accuracy("Reference-Continue@0.7")


def test_a_call_at_the_start_gives_the_first_n_tokens(smol_tokenizer) -> None:
    full = _tokens(smol_tokenizer, reference_text(ITEM))
    completion = reference_completion(ITEM, 6, smol_tokenizer, written="")
    assert completion.token_ids == full[:6] and completion.finish_reason == "length"
    assert completion == reference_completion(ITEM, 6, smol_tokenizer)  # as `reference` does


def test_a_call_after_the_first_step_gives_the_next_part(smol_tokenizer) -> None:
    written = f"Let me work it out.\n{FIRST_STEP}"
    completion = reference_completion(ITEM, 200, smol_tokenizer, written=written)
    assert completion.text == "\n= 1280 + 320\n= 1600\n\nThe final answer is $\\boxed{1600}$."
    assert completion.finish_reason == "stop"
    # The stateless stand-in would have started over.
    assert reference_completion(ITEM, 200, smol_tokenizer).text.startswith(FIRST_STEP)


def test_a_step_begun_is_continued_mid_step_whatever_the_spacing(smol_tokenizer) -> None:
    completion = reference_completion(ITEM, 6, smol_tokenizer, written="So 64×25 = 64 × 20 +")
    assert completion.text.startswith(" 64 × 5") and completion.finish_reason == "length"
    # Two matching characters are not a step begun: "= 1" could be anything.
    assert reached(reference_text(ITEM), "x = 1") == 0


def test_a_short_call_gives_only_part_and_calls_in_turn_reach_the_answer(smol_tokenizer) -> None:
    written, calls = "", []
    while len(calls) < 30:  # bounded: a stand-in that never got further would loop
        calls.append(reference_completion(ITEM, 5, smol_tokenizer, written=written))
        written += calls[-1].text
        if calls[-1].finish_reason == "stop":
            break
        assert extract_answer(written, ("boxed",)) is None  # n = 5 gives only part of it
    assert len(calls) > 2 and extract_answer(written, ("boxed",)) == "1600"
    assert " ".join(written.split()) == " ".join(reference_text(ITEM).split())


def test_a_finished_answer_gets_an_empty_reply_that_stops(smol_tokenizer) -> None:
    completion = reference_completion(ITEM, 8, smol_tokenizer, written=reference_text(ITEM))
    assert (completion.text, completion.finish_reason) == ("", "stop")


def test_a_fallible_continuing_stand_in_misses_what_it_does_not_know(smol_tokenizer) -> None:
    completion = reference_completion(ITEM, 200, smol_tokenizer, 0.0, written=FIRST_STEP)
    assert "\\boxed{1600}" not in completion.text and "1280" not in completion.text
    wrong = extract_answer(completion.text, ("boxed",))
    assert wrong is not None and 1 <= int(wrong) - 1600 <= 9


def test_the_pool_hands_the_continuing_stand_in_the_partial_answer(smol_tokenizer) -> None:
    chat = [{"role": "user", "content": "What is 64 × 25?"}]
    partial = [*chat, {"role": "assistant", "content": FIRST_STEP}]
    asked = [Call(1, partial, ITEM), Call(1, chat, ITEM), Call(2, partial, ITEM)]
    config = PoolConfig(endpoints=["reference-continue@1", "reference"], num_experts=2)
    with ExpertPool(config, tokenizer=smol_tokenizer) as pool:
        going_on, starting, stateless = pool.ask_sync(asked, _params())
    assert going_on.endpoint == "reference-continue@1 (stand-in)" and going_on.outcome == "ok"
    assert going_on.text.startswith("\n= 1280 + 320")
    assert starting.text.startswith(FIRST_STEP) and stateless.text.startswith(FIRST_STEP)


def _params():
    from collabrl.engines.base import SamplingParams

    return SamplingParams(max_tokens=100)


# --- the worked solutions of the evidence data ----------------------------------------------------


@pytest.mark.parametrize(
    ("problem", "solution"),
    [
        ("36 × 15", "36 × 15 = 36 × 10 + 36 × 5\n= 360 + 180\n= 540"),
        ("373 + 474", "373 + 474 = (300 + 400) + (70 + 70) + (3 + 4)\n= 700 + 140 + 7\n= 847"),
        ("15 + 50", "15 + 50 = (10 + 50) + (5 + 0)\n= 60 + 5\n= 65"),
        (
            "30 + 7 × 4",
            "7 × 4 = 28\nso 30 + 7 × 4 = 30 + 28\n30 + 28 = (30 + 20) + (0 + 8)\n= 50 + 8\n= 58",
        ),
        (
            "77 - 91",
            "77 - 91 = -(91 - 77)\n91 - 77 = 91 - 70 - 7\n= 21 - 7\n= 14\nso 77 - 91 = -14",
        ),
    ],
)
def test_worked_solutions_go_one_step_a_line(problem: str, solution: str) -> None:
    arith_mix = load_script("arith_mix")
    worked, _ = arith_mix.worked_solution(f"What is {problem}? Put your final answer ...")
    assert worked == solution


def test_every_evidence_row_gets_a_solution_the_loader_reads(tmp_path: Path) -> None:
    arith_mix = load_script("arith_mix")
    families = "add1,add2,sub2,mul21,mul22,add3,sub2neg,mix,div,add1x3,addsub1,addmul1"
    # Every problem of every family works out to its answer (mix asserts it).
    for split in ("train", "test"):
        assert len(arith_mix.mix(families.split(","), split, 10**6, True)) > 100
    arith_mix.main(["add1,mul22", "3", "2", str(tmp_path), "--solutions"])
    item = load_benchmark(str(tmp_path / "test.jsonl")).items[1]
    assert item.id.split("-")[2] == "mul22" and item.solution is not None
    assert item.solution.count("\n") >= 2 and item.reference.solution == item.solution
    # Without --solutions the rows are arith's, so the other methods' experts do not change.
    arith_mix.main(["add1,mul22", "3", "2", str(tmp_path)])
    rows = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and not any("solution" in row for row in rows)
