"""Parsing AlphaApollo `<tool_call>` blocks from raw policy output: total over any text."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collabrl.protocols.parsing import ToolCall, parse_tool_call


def block(body: str) -> str:
    return f"Let me compute.\n<tool_call>\n{body}\n</tool_call>"


def test_json_call():
    body = json.dumps({"name": "python", "arguments": {"code": "print(1)"}})
    assert parse_tool_call(block(body)) == ToolCall("python", {"code": "print(1)"})


def test_arguments_as_a_json_string():
    body = json.dumps({"name": "retrieve", "arguments": json.dumps({"query": "solve"})})
    assert parse_tool_call(block(body)) == ToolCall("retrieve", {"query": "solve"})


def test_missing_arguments_is_an_empty_object():
    assert parse_tool_call(block('{"name": "python"}')) == ToolCall("python", {})


def test_last_block_is_parsed():
    first = block('{"name": "a", "arguments": {}}')
    second = block('{"name": "b", "arguments": {}}')
    assert parse_tool_call(first + " then " + second).name == "b"


@pytest.mark.parametrize(
    "text, error",
    [
        ("no tags at all", "no </tool_call>"),
        ("just a close </tool_call>", "</tool_call> without <tool_call>"),
        ("<tool_call>   </tool_call>", "empty tool call"),
        (block("[1, 2]"), 'a tool call is a JSON object {"name": …, "arguments": …}'),
        (block('{"arguments": {}}'), 'the tool call has no "name"'),
        (block('{"name": "python", "arguments": [1]}'), '"arguments" is not a JSON object'),
        (block('{"name": "python", "arguments": "{bad"}'), '"arguments" is not a JSON object'),
        (block("print(1)"), "the tool call is not valid JSON"),
    ],
)
def test_malformed_calls_are_errors(text, error):
    call = parse_tool_call(text)
    assert not call.ok and call.error == error


def test_code_body_is_a_lenient_python_call():
    call = parse_tool_call(block("```python\nx = 2\nprint(x * 3)\n```"), code_tool="python")
    assert call == ToolCall("python", {"code": "x = 2\nprint(x * 3)\n"}, lenient=True)
    bare = parse_tool_call(block("print(6 * 7)"), code_tool="python")
    assert bare.ok and bare.lenient and bare.arguments == {"code": "print(6 * 7)"}


def test_broken_json_is_not_run_as_code():
    call = parse_tool_call(block('{"name": "python", "arguments": {"code": 8 + 6}}'), "python")
    assert call.error == "the tool call is not valid JSON"


def test_json_wins_over_lenient_reading():
    body = json.dumps({"name": "retrieve", "arguments": {"query": "x"}})
    assert not parse_tool_call(block(body), code_tool="python").lenient


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<>/{}[]":,tool_call ab1\n')), max_size=80))
def test_any_text_parses_without_raising(text):
    call = parse_tool_call(text + "</tool_call>")
    assert call.ok or call.error
