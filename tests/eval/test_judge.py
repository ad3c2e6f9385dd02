"""Tests for the optional LLM judge: its prompt, reply parsing and batching."""

from __future__ import annotations

import pytest

from collabrl.eval.judge import (
    JUDGE_PARAMS,
    JUDGE_SYSTEM,
    Verdict,
    judge_answers,
    judge_messages,
    parse_verdict,
)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Yes", True),
        ("yes", True),
        ("YES.", True),
        ("  Yes, the answer is correct.", True),
        ("**Yes**", True),
        ("> yes", True),
        ("`Yes`", True),
        ('"Yes"', True),
        ("### Yes", True),
        ("No", False),
        ("no, it is wrong", False),
        ("", False),
        ("   ", False),
        ("Not yes", False),
        ("The answer is correct: Yes", False),
        ("Y", False),
        ("Nope", False),
    ],
)
def test_parse_verdict(reply: str, expected: bool) -> None:
    assert parse_verdict(reply) is expected


def test_judge_messages_follow_relayllm() -> None:
    system, user = judge_messages("\\frac{1}{2}", "0.5")
    assert system == {"role": "system", "content": JUDGE_SYSTEM}
    assert system["content"] == "You are a math answer checker."
    assert user["role"] == "user"
    assert user["content"] == (
        "Hi, there is an answer: \\frac{1}{2},\n"
        "and the ground truth answer is:\n"
        "0.5,\n"
        "please check whether the answer\n"
        "is correct or not, and return the\n"
        "only Yes or No."
    )


def test_judge_messages_keep_placeholder_text_in_answers_verbatim() -> None:
    (_, user) = judge_messages("\\text{{gold}} {answer}", "7")
    assert "answer: \\text{{gold}} {answer},\n" in user["content"]
    assert "is:\n7,\n" in user["content"]


def test_judge_params_are_short_and_seeded() -> None:
    assert JUDGE_PARAMS.max_tokens <= 16
    assert JUDGE_PARAMS.seed is not None
    assert JUDGE_PARAMS.n == 1


def test_judge_answers_with_no_pairs_does_not_generate() -> None:
    class Closed:
        name = "closed"

        def generate(self, prompts, params):
            raise AssertionError("must not be called")

        def close(self) -> None: ...

    assert judge_answers(Closed(), []) == []


def test_judge_answers_runs_one_prompt_per_pair(tiny_engine) -> None:
    class Recording:
        """The real tiny engine, remembering what it was asked and what it said."""

        name = "recording"

        def __init__(self) -> None:
            self.calls: list = []

        def generate(self, prompts, params):
            out = tiny_engine.generate(prompts, params)
            self.calls.append((prompts, params, out))
            return out

        def close(self) -> None: ...

    pairs = [("1", "1"), ("2", "3"), ("x", "y")]
    engine = Recording()
    verdicts = judge_answers(engine, pairs)
    ((prompts, params, out),) = engine.calls  # one batched call
    assert prompts == [judge_messages(a, g) for a, g in pairs]
    assert params == JUDGE_PARAMS
    assert len(verdicts) == 3
    for verdict, (completion,) in zip(verdicts, out, strict=True):
        assert isinstance(verdict, Verdict)
        assert verdict.raw == completion.text
        assert verdict.correct is parse_verdict(completion.text)
