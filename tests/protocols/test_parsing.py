"""Parsing RelayLLM `<call>n</call>` and EAPO `<agent_calls>` actions from raw policy output."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collabrl.protocols.parsing import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    AgentCalls,
    ExpertQuery,
    RelayCall,
    agent_returns_pieces,
    code_blocks,
    format_agent_calls,
    parse_agent_calls,
    parse_relay_call,
    parse_tool_call,
    strip_call_commands,
)
from tests.linear_time import assert_linear

# ----------------------------------------------------------------------------- parse_relay_call


def returns_block(results: list[tuple[int, str | None]]) -> str:
    """The `<agent_returns>` block answering a call, as one string."""
    return "".join(agent_returns_pieces(results))


def test_no_call_tag_is_none():
    assert parse_relay_call("just reasoning </call> 5", max_n=100) is None
    assert parse_relay_call("", max_n=100) is None


def test_well_formed_call():
    text = "Let me think. <call>50</call>"
    assert parse_relay_call(text, max_n=100) == RelayCall(n=50, start=14)
    assert parse_relay_call(text, max_n=100).ok


@pytest.mark.parametrize("inner", [" 7 ", "\n7\t", "+7", "007", " +007 "])
def test_whitespace_plus_and_leading_zeros(inner):
    call = parse_relay_call(f"x<call>{inner}</call>", max_n=100)
    assert call.ok and call.n == 7


def test_trailing_whitespace_after_close_tolerated():
    assert parse_relay_call("<call>3</call>\n", max_n=10).n == 3


def test_above_max_is_refused():
    call = parse_relay_call("<call>500</call>", max_n=100)
    assert call == RelayCall(n=None, start=0, error="over max_call_tokens (100)")
    assert not call.ok


def test_exactly_max_is_granted():
    call = parse_relay_call("<call>100</call>", max_n=100)
    assert call.ok and call.n == 100


def test_a_request_padded_with_digits_is_refused():
    """A policy trained on the realised ρ learned to pad its request with digits, its own
    tokens, diluting ρ: more digits than max_n has is refused, leading zeros included."""
    assert parse_relay_call("<call>0100</call>", max_n=100).error == "over max_call_tokens (100)"
    padded = "<call>19891422442222224828292222222668846868686</call>"
    assert parse_relay_call(padded, max_n=1000).error == "over max_call_tokens (1000)"


@pytest.mark.parametrize("inner", ["0", "000", "-3", "-0", " -12 ", "-" + "9" * 5000])
def test_zero_and_negative_are_not_positive(inner):
    call = parse_relay_call(f"<call>{inner}</call>", max_n=100)
    assert call.error == "not positive" and call.n is None and not call.ok


@pytest.mark.parametrize(
    "inner", ["abc", "1.5", "1e3", "++3", "+-3", "--3", "3 4", "１２", "٣", "0x10", "3</call>x"]
)
def test_non_numbers(inner):
    call = parse_relay_call(f"<call>{inner}</call>", max_n=100)
    assert call.error == "not a number" and call.n is None


@pytest.mark.parametrize("inner", ["", "   ", "\n"])
def test_empty(inner):
    assert parse_relay_call(f"<call>{inner}</call>", max_n=100).error == "empty"


@pytest.mark.parametrize(
    "text", ["<call>5", "<call>5</call> and more", "<call>5</ call>", "a <call>", "<call>5</call"]
)
def test_unclosed(text):
    call = parse_relay_call(text, max_n=100)
    assert call.error == "unclosed" and call.n is None and call.start == text.rfind("<call>")


def test_nested_last_open_wins():
    call = parse_relay_call("<call><call>3</call>", max_n=100)
    assert call == RelayCall(n=3, start=6)


def test_last_call_is_parsed():
    text = "<call>2</call>teacher text<call>9</call>"
    assert parse_relay_call(text, max_n=100) == RelayCall(n=9, start=text.rfind("<call>"))


def test_huge_number_is_refused_quickly():
    call = parse_relay_call("<call>" + "9" * 1_000_000 + "</call>", max_n=256)
    assert call.n is None and call.error == "over max_call_tokens (256)"
    # Ten digits against a large max_n: compared exactly, not rejected by digit count.
    assert parse_relay_call("<call>1234567890</call>", max_n=10**12).n == 1234567890


def test_bad_max_n_raises():
    with pytest.raises(ValueError):
        parse_relay_call("<call>1</call>", max_n=0)


# ----------------------------------------------------------------------------- strip_call_commands


@pytest.mark.parametrize(
    "text, expected",
    [
        ("no commands", "no commands"),
        ("a <call>5</call> b", "a  b"),
        ("a<call>5</call>b<call>abc</call>c", "abc"),
        ("a<call></call>b", "ab"),
        ("a<call>-1</call>b<call>\n</call>", "ab"),
        ("text <call>5", "text "),
        ("text <call>", "text "),
        ("a<call>1</call>b<call>2", "ab"),
        # Non-greedy from the earliest open: teacher text after the close survives.
        ("<call>a<call>3</call>c</call>", "c</call>"),
        ("stray </call> close", "stray </call> close"),
        # A tag formed only once a command is cut out is a command too.
        ("<ca<call>1</call>ll>2</call>x", "x"),
        ("<ca<call>1</call>ll>", ""),
        ("<call", "<call"),
    ],
)
def test_strip_call_commands(text, expected):
    assert strip_call_commands(text) == expected


def test_strip_is_linear_on_many_opens():
    text = "<call>" * 100_000 + "x"
    assert strip_call_commands(text) == ""
    assert strip_call_commands("<call>1</call>y" * 50_000) == "y" * 50_000


# ----------------------------------------------------------------------------- parse_agent_calls


def _calls(body: str) -> str:
    return f"I need help.\n<agent_calls>{body}</agent_calls>"


def test_no_agent_calls_tag_is_none():
    assert parse_agent_calls("Answer: 5 </agent_calls>", num_experts=3, max_calls=3) is None


def test_paper_format():
    body = json.dumps(
        [
            {"expert_id": 1, "input_parameters": {"query": "What is 17 * 23?"}},
            {"expert_id": 3, "input_parameters": {"query": "Who wrote Dune?"}},
        ]
    )
    text = _calls(body)
    calls = parse_agent_calls(text, num_experts=3, max_calls=3)
    assert calls == AgentCalls(
        queries=(ExpertQuery(1, "What is 17 * 23?"), ExpertQuery(3, "Who wrote Dune?")),
        errors=(),
        start=text.index("<agent_calls>"),
    )
    assert calls.ok


def test_fenced_json_and_whitespace():
    body = '\n```json\n[{"expert_id": 2, "input_parameters": {"query": " q "}}]\n```\n'
    calls = parse_agent_calls(_calls(body), num_experts=3, max_calls=3)
    assert calls.queries == (ExpertQuery(2, "q"),) and calls.errors == ()
    bare_fence = '```[{"expert_id": 2, "input_parameters": {"query": "q"}}]```'
    assert parse_agent_calls(_calls(bare_fence), 3, 3).queries == (ExpertQuery(2, "q"),)


def test_single_object_is_a_list_of_one():
    body = '{"expert_id": 1, "input_parameters": {"query": "q"}}'
    assert parse_agent_calls(_calls(body), 2, 2).queries == (ExpertQuery(1, "q"),)


def test_numeric_string_id_is_converted():
    body = '[{"expert_id": " 2", "input_parameters": {"query": "q"}}]'
    assert parse_agent_calls(_calls(body), 2, 2).queries == (ExpertQuery(2, "q"),)


@pytest.mark.parametrize(
    "item, error",
    [
        ({"expert_id": 7, "input_parameters": {"query": "q"}}, "unknown expert id 7"),
        ({"expert_id": 0, "input_parameters": {"query": "q"}}, "unknown expert id 0"),
        ({"expert_id": -1, "input_parameters": {"query": "q"}}, "unknown expert id -1"),
        ({"expert_id": True, "input_parameters": {"query": "q"}}, "expert_id is not an integer"),
        ({"expert_id": 1.0, "input_parameters": {"query": "q"}}, "expert_id is not an integer"),
        ({"expert_id": "two", "input_parameters": {"query": "q"}}, "expert_id is not an integer"),
        ({"expert_id": None, "input_parameters": {"query": "q"}}, "expert_id is not an integer"),
        ({"input_parameters": {"query": "q"}}, "missing expert_id"),
        ({"expert_id": 1}, "missing input_parameters"),
        ({"expert_id": 1, "input_parameters": "q"}, "input_parameters is not an object"),
        ({"expert_id": 1, "input_parameters": {}}, "missing query"),
        ({"expert_id": 1, "input_parameters": {"query": 5}}, "query is not a string"),
        ({"expert_id": 1, "input_parameters": {"query": "  "}}, "empty query"),
        ("just a string", "not an object"),
    ],
)
def test_bad_items_are_skipped_with_an_error(item, error):
    good = {"expert_id": 2, "input_parameters": {"query": "ok"}}
    calls = parse_agent_calls(_calls(json.dumps([good, item])), num_experts=3, max_calls=3)
    assert calls.queries == (ExpertQuery(2, "ok"),)
    assert len(calls.errors) == 1 and calls.errors[0].startswith(f"item 2: {error}")
    assert not calls.ok


def test_too_many_calls_keeps_the_first():
    items = [{"expert_id": 1, "input_parameters": {"query": f"q{i}"}} for i in range(5)]
    calls = parse_agent_calls(_calls(json.dumps(items)), num_experts=1, max_calls=3)
    assert [q.query for q in calls.queries] == ["q0", "q1", "q2"]
    assert calls.errors == ("too many calls: 5 > 3",)


@pytest.mark.parametrize(
    "body", ['[{"expert_id": 1,', "not json", "[1, 2,]", "{'expert_id': 1}", "[" * 5000]
)
def test_invalid_json(body):
    calls = parse_agent_calls(_calls(body), num_experts=3, max_calls=3)
    assert calls.queries == () and len(calls.errors) == 1
    assert calls.errors[0].startswith("invalid JSON: ")


def test_huge_integer_does_not_raise():
    body = '[{"expert_id": ' + "9" * 5000 + ', "input_parameters": {"query": "q"}}]'
    calls = parse_agent_calls(_calls(body), 3, 3)
    assert calls.queries == () and calls.errors
    # Below the digit limit it parses, and the error message stays short.
    body = '[{"expert_id": ' + "9" * 4000 + ', "input_parameters": {"query": "q"}}]'
    calls = parse_agent_calls(_calls(body), 3, 3)
    assert calls.errors[0].startswith("item 1: unknown expert id") and len(calls.errors[0]) < 80


@pytest.mark.parametrize(
    "body, error",
    [("", "empty <agent_calls>"), ("[]", "empty list of calls"), ("5", "not a list of calls")],
)
def test_empty_and_non_list(body, error):
    assert parse_agent_calls(_calls(body), 3, 3).errors == (error,)


def test_unclosed_agent_calls():
    text = '<agent_calls>[{"expert_id": 1, "input_parameters": {"query": "q"}}]'
    assert parse_agent_calls(text, 3, 3) == AgentCalls((), ("unclosed <agent_calls>",), 0)


def test_last_block_wins():
    first = _calls('[{"expert_id": 1, "input_parameters": {"query": "a"}}]')
    text = first + " then " + _calls('[{"expert_id": 2, "input_parameters": {"query": "b"}}]')
    calls = parse_agent_calls(text, 3, 3)
    assert calls.queries == (ExpertQuery(2, "b"),) and calls.start == text.rfind("<agent_calls>")


def test_returns_block():
    out = returns_block([(1, "4 1 1"), (2, None), (3, "naïve")])
    assert out.startswith("<agent_returns>") and out.endswith("</agent_returns>")
    assert "naïve" in out  # ensure_ascii=False keeps the expert's text readable
    payload = json.loads(out[len("<agent_returns>") : -len("</agent_returns>")])
    assert payload == [
        {"expert_id": 1, "result": "4 1 1"},
        {"expert_id": 2, "result": "unavailable"},
        {"expert_id": 3, "result": "naïve"},
    ]
    assert returns_block([]) == "<agent_returns>[]</agent_returns>"


# ----------------------------------------------------------------------------- properties

_FRAGMENTS = [
    "<call>",
    "</call>",
    "<call><call>",
    "</call></call>",
    "<ca",
    "ll>",
    "<",
    ">",
    "/",
    "0",
    "7",
    "42",
    "+",
    "-",
    " ",
    "\n",
    "9" * 5000,
    "１２",
    "é∑😀",
    "<agent_calls>",
    "</agent_calls>",
    "```json",
    "```",
    "[",
    "]",
    "{",
    "}",
    ",",
    '"expert_id"',
    '"input_parameters"',
    '"query"',
    '"q"',
    '"2"',
    ": ",
    "true",
    "null",
    "1e999",
    "[" * 5000,
    "{" * 3000,
    '{"a":' * 2000,
]

_mixed_text = st.lists(
    st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=6)), max_size=40
).map("".join)
_any_text = st.one_of(st.text(), _mixed_text)

_json_value = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True),
        st.text(max_size=8),
        st.sampled_from(["1", "2", " 3 ", "x"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(
            st.one_of(st.sampled_from(["expert_id", "input_parameters", "query"]), st.text()),
            children,
            max_size=4,
        ),
    ),
    max_leaves=20,
)
# Items close to the paper format, so the property also reaches valid and partly valid calls.
_near_valid_item = st.fixed_dictionaries(
    {
        "expert_id": st.one_of(
            st.integers(min_value=-1, max_value=7), st.booleans(), st.sampled_from(["1", "x"])
        ),
        "input_parameters": st.one_of(
            st.fixed_dictionaries({"query": st.one_of(st.text(max_size=10), st.integers())}),
            st.none(),
        ),
    }
)
_agent_text = st.one_of(
    _any_text,
    st.tuples(
        _any_text, st.one_of(_json_value, st.lists(_near_valid_item, max_size=6)), _any_text
    ).map(lambda t: f"{t[0]}<agent_calls>{json.dumps(t[1])}</agent_calls>{t[2]}"),
)


@settings(max_examples=1000, deadline=None)
@given(text=_any_text, max_n=st.integers(min_value=1, max_value=10**12))
def test_relay_call_property(text, max_n):
    call = parse_relay_call(text, max_n)
    assert (call is None) == ("<call>" not in text)
    if call is not None:
        assert call.start == text.rfind("<call>")
        assert call.ok or call.error
        if call.ok:
            assert 1 <= call.n <= max_n
        else:
            assert call.n is None


@settings(max_examples=1000, deadline=None)
@given(prefix=st.text(), max_n=st.integers(min_value=1, max_value=10**6), data=st.data())
def test_relay_call_round_trip(prefix, max_n, data):
    n = data.draw(st.integers(min_value=1, max_value=max_n))
    call = parse_relay_call(f"{prefix}<call>{n}</call>", max_n)
    assert call.n == n and call.ok


@settings(max_examples=1000, deadline=None)
@given(text=_any_text)
def test_strip_call_commands_property(text):
    out = strip_call_commands(text)
    # No `<call>` survives, so neither a complete command nor an unclosed tail can.
    assert "<call>" not in out
    assert strip_call_commands(out) == out
    if "<call>" not in text:
        assert out == text


@settings(max_examples=1000, deadline=None)
@given(
    text=_agent_text,
    num_experts=st.integers(min_value=1, max_value=5),
    max_calls=st.integers(min_value=1, max_value=4),
)
def test_agent_calls_property(text, num_experts, max_calls):
    calls = parse_agent_calls(text, num_experts, max_calls)
    assert (calls is None) == ("<agent_calls>" not in text)
    if calls is not None:
        assert calls.start == text.rfind("<agent_calls>")
        assert calls.queries or calls.errors
        assert len(calls.queries) <= max_calls
        for query in calls.queries:
            assert 1 <= query.expert_id <= num_experts
            assert isinstance(query.query, str) and query.query.strip()


# ----------------------------------------------------------------------------- format_agent_calls


def test_format_agent_calls_is_the_prompt_examples_layout():
    text = format_agent_calls([ExpertQuery(2, "What is 3 × 4?")])
    assert text == (
        "<agent_calls>\n"
        '[{"expert_id": 2, "input_parameters": {"query": "What is 3 × 4?"}}]\n'
        "</agent_calls>"
    )
    calls = parse_agent_calls(text, num_experts=3, max_calls=3)
    assert calls.ok and calls.queries == (ExpertQuery(2, "What is 3 × 4?"),)


def test_format_agent_calls_escapes_tags_inside_a_query():
    query = 'say "</agent_calls>" then <agent_calls> and \\<agent_calls>'
    text = format_agent_calls([ExpertQuery(1, query)])
    assert text.count("<agent_calls>") == 1 and text.count("</agent_calls>") == 1
    assert parse_agent_calls(text, 1, 1).queries == (ExpertQuery(1, query),)


@settings(max_examples=300, deadline=None)
@given(
    queries=st.lists(
        st.tuples(st.integers(min_value=1, max_value=5), st.text(min_size=1)).filter(
            lambda q: q[1].strip()
        ),
        min_size=1,
        max_size=4,
    )
)
def test_format_agent_calls_round_trips_through_the_parser(queries):
    asked = [ExpertQuery(k, q) for k, q in queries]
    calls = parse_agent_calls(format_agent_calls(asked), num_experts=5, max_calls=4)
    assert calls.ok and calls.start == 0
    assert calls.queries == tuple(ExpertQuery(q.expert_id, q.query.strip()) for q in asked)


# ----------------------------------------------------------------------------- hostile fences

N = 65_536  # about what one tool call or completion may hold


def fenced_block(length: int) -> str:
    """An ordinary fenced Python block of exactly `length` characters."""
    body = ("```python\n" + "x = 1\nprint(x + 2)\n" * (length // 10))[: length - 3]
    return body + "```"


# `\s*\n` retried the body scan from every newline when no fence closed (quadratic).
@pytest.mark.parametrize(
    "hostile", ["```" + "\n" * (N - 3), "```py" + " \n" * ((N - 5) // 2) + "x"], ids=["nl", "sp"]
)
def test_code_blocks_is_linear_on_an_unclosed_fence(hostile):
    assert_linear(code_blocks, hostile, fenced_block(len(hostile)))
    # A tool call whose body is not JSON is read as (fenced) code with the same pattern.
    call, benign = (
        f"{TOOL_CALL_OPEN}{body}x{TOOL_CALL_CLOSE}"
        for body in (hostile, fenced_block(len(hostile)))
    )
    assert_linear(lambda text: parse_tool_call(text, "python"), call, benign)


def test_agent_calls_fence_is_linear():
    hostile = _calls("```" + "a" * (N - 3))
    benign = '```json\n[{"expert_id": 1, "input_parameters": {"query": "%s"}}]\n```'
    benign = _calls(benign % ("q" * (N - len(benign) + 2)))
    assert_linear(lambda t: parse_agent_calls(t, 3, 3), hostile, benign)


# The backtracking pattern code_blocks used before, as an oracle on short inputs.
_BACKTRACKING_CODE_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
_FENCE_PIECES = ["```", "`", "python", "py", "js", " ", "\t", "\n", "\r", "x", "print(1)"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(_FENCE_PIECES), max_size=16).map("".join))
def test_code_blocks_reads_what_the_backtracking_pattern_read(text):
    assert code_blocks(text) == _BACKTRACKING_CODE_FENCE.findall(text)


@pytest.mark.parametrize(
    ("text", "blocks"),
    [
        ("```python\nprint(1)\n```", ["print(1)\n"]),
        ("a\n```py  \n\n x\n```b```\ny\n```", [" x\n", "y\n"]),
        ("```js\nno\n```\nmid\n```python\nyes\n```", ["mid\n"]),
        ("```python\nunclosed", []),
    ],
)
def test_code_blocks_examples(text, blocks):
    assert code_blocks(text) == blocks
