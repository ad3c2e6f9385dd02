"""Answers inside call blocks are never graded (issue 33): for every protocol tag, a
`\\boxed{}` (or a bare number, for the last-number fallback) that the policy wrote inside
the block, closed or cut open by the budget, is no answer; one outside it still is. Each
protocol's own answer text is read, with GSM8K's extractors (the strictest test: the
fallback reads any number)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from collabrl.data.benchmarks import load_benchmark
from collabrl.data.prompts import get_prompt
from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.protocols import apollo, consult
from collabrl.protocols.parsing import (
    AGENT_CALLS_CLOSE,
    AGENT_CALLS_OPEN,
    AGENT_RETURNS_CLOSE,
    AGENT_RETURNS_OPEN,
    CALL_CLOSE,
    CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    strip_call_commands,
)
from collabrl.protocols.rounds import finish

GSM8K = load_benchmark("gsm8k", limit=1)
EXTRACTORS = get_prompt(GSM8K.prompt).extractors(GSM8K.extract_fallback)


def _relay_text(episode: Episode) -> str:
    """What relay reads its answer in (relay.py): the response, its call commands cut out."""
    return strip_call_commands(episode.response_text)


# (open tag, close tag, the protocol's answer text)
TAGS = [
    pytest.param(CALL_OPEN, CALL_CLOSE, _relay_text, id="call"),
    pytest.param(AGENT_CALLS_OPEN, AGENT_CALLS_CLOSE, consult.policy_text, id="agent_calls"),
    pytest.param(AGENT_RETURNS_OPEN, AGENT_RETURNS_CLOSE, consult.policy_text, id="agent_returns"),
    pytest.param(TOOL_CALL_OPEN, TOOL_CALL_CLOSE, apollo.policy_text, id="tool_call"),
    pytest.param(TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE, apollo.policy_text, id="tool_response"),
]


def _answer(text: str, answer_text: Callable[[Episode], str]) -> str | None:
    episode = Episode("p", [1], meta={"protocol": "test"})
    episode.add(Segment(Author.POLICY, text, [2]))
    episode.end = EndReason.EOS
    finish(episode, answer_text, EXTRACTORS)
    return episode.answer


@pytest.mark.parametrize(("open_", "close", "answer_text"), TAGS)
@pytest.mark.parametrize("closed", [True, False], ids=["closed", "cut open"])
def test_an_answer_inside_a_block_is_no_answer(open_, close, answer_text, closed) -> None:
    inside = "Answer: 7\n\\boxed{7} 7"
    text = f"Let me check first.\n{open_}{inside}{close if closed else ''}"
    assert _answer(text, answer_text) is None


@pytest.mark.parametrize(("open_", "close", "answer_text"), TAGS)
def test_an_answer_outside_the_block_is_the_answer(open_, close, answer_text) -> None:
    text = f"{open_}\\boxed{{7}}{close}\nSo the answer is \\boxed{{3}}."
    assert _answer(text, answer_text) == "3"
