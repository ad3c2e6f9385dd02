"""Tests for the prompt templates."""

from __future__ import annotations

import pytest

from collabrl.data.prompts import PROMPTS, get_prompt
from collabrl.errors import UserError
from collabrl.rewards.extract import extract_answer

TRICKY = "Let $f(x) = \\frac{x}{2}$ and {problem} {0} {} }{ ; find $f(\\{1,2\\})$."


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_templates_keep_problems_with_braces_verbatim(name: str) -> None:
    messages = get_prompt(name).messages(TRICKY)
    assert messages[-1] == {"role": "user", "content": TRICKY}
    assert all(m["content"] for m in messages)


def test_relay_has_the_boxed_system_prompt() -> None:
    messages = get_prompt("relay").messages("1+1?")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "\\boxed{}" in messages[0]["content"]
    assert get_prompt("relay").extract[0] == "boxed"


def test_eapo_eval_asks_for_an_answer_line() -> None:
    messages = get_prompt("eapo-eval").messages("1+1?")
    assert 'format of "Answer: xxx"' in messages[0]["content"]
    assert get_prompt("eapo-eval").extract[0] == "answer_line"


def test_plain_has_no_system_message() -> None:
    assert get_prompt("plain").messages("1+1?") == [{"role": "user", "content": "1+1?"}]


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_every_template_names_known_extractors(name: str) -> None:
    template = get_prompt(name)
    assert template.name == name
    assert template.source
    for extractor in template.extract:
        extract_answer("Answer: 4 \\boxed{4} 4", (extractor,))  # raises if unknown


def test_unknown_template_lists_the_known_ones() -> None:
    with pytest.raises(UserError) as info:
        get_prompt("socratic")
    assert "unknown prompt template 'socratic'" in info.value.problem
    for name in PROMPTS:
        assert name in info.value.fix
