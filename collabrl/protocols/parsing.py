"""Parse the action formats a policy emits to ask for help.

- RelayLLM: `<call>n</call>` asks a teacher to write the next `n` tokens. Generation
  stops at the stop string `</call>`, so a call, when made, ends the text.
- EAPO: `<agent_calls>[{"expert_id": 1, "input_parameters": {"query": "…"}}]</agent_calls>`
  asks experts questions; their answers come back in an `<agent_returns>` block.

The input is raw model output, so nothing here may raise on it: a malformed action
becomes a recorded format error (which rewards and metrics can count). Only a caller's
bad limits (`max_n < 1`, …) raise, since those are programming errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

CALL_OPEN = "<call>"
CALL_CLOSE = "</call>"
AGENT_CALLS_OPEN = "<agent_calls>"
AGENT_CALLS_CLOSE = "</agent_calls>"
AGENT_RETURNS_OPEN = "<agent_returns>"
AGENT_RETURNS_CLOSE = "</agent_returns>"

# ASCII digits only: `\d` would accept full-width and other Unicode digits, which a
# tokenizer-level protocol should treat as text, not a number.
_SIGNED_INT_RE = re.compile(r"([+-]?)([0-9]+)")
# A numeric expert id written as a string ("2"); a bound on length keeps int() cheap.
_ID_STRING_RE = re.compile(r"\+?[0-9]{1,9}")
_FENCE_LANG_RE = re.compile(r"```[A-Za-z]*")


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _short(value: object, limit: int = 40) -> str:
    """A bounded repr for error messages (a 4000-digit id must not bloat a record)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----------------------------------------------------------------------------- RelayLLM


@dataclass(frozen=True)
class RelayCall:
    """The policy's last `<call>` command: a token budget for the teacher, or an error."""

    n: int | None
    start: int  # index in the text where the last `<call>` begins, -1 if none
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.n is not None


def format_relay_call(n: int) -> str:
    """The command the policy writes to hand the teacher n tokens: `<call>n</call>`."""
    return f"{CALL_OPEN}{n}{CALL_CLOSE}"


def parse_relay_call(text: str, max_n: int) -> RelayCall | None:
    """Parse the last `<call>n</call>` in `text`; None when no `<call>` appears at all.

    `n` must be a positive ASCII integer (surrounding whitespace and a leading `+`
    allowed) of at most `max_n`, written in no more digits than `max_n` has. A larger
    request is refused, not cut down to `max_n`: a policy trained on the realised ρ
    padded its request with dozens of digits, its own tokens, which lowered ρ while the
    cut-down call still brought the teacher's whole solution (docs/results.md).
    """
    _check_positive("max_n", max_n)
    start = text.rfind(CALL_OPEN)
    if start < 0:
        return None
    # The stop string ends generation, so a made call closes the text; trailing
    # whitespace is tolerated because some engines append it after the stop string.
    end = text.rstrip()
    if not end.endswith(CALL_CLOSE):
        return RelayCall(n=None, start=start, error="unclosed")
    # `<call>` cannot overlap `</call>`, so the last opening lies before this close.
    inner = end[start + len(CALL_OPEN) : len(end) - len(CALL_CLOSE)].strip()
    if not inner:
        return RelayCall(n=None, start=start, error="empty")
    match = _SIGNED_INT_RE.fullmatch(inner)
    if match is None:
        return RelayCall(n=None, start=start, error="not a number")
    sign, digits = match.groups()
    if sign == "-" or not digits.lstrip("0"):
        return RelayCall(n=None, start=start, error="not positive")
    # Compare lengths before converting, so a 10**6-digit request costs no big-int work
    # (and cannot hit Python's int/str conversion limit); leading zeros count as digits.
    if len(digits) > len(str(max_n)) or int(digits) > max_n:
        return RelayCall(n=None, start=start, error=f"over max_call_tokens ({max_n})")
    return RelayCall(n=int(digits), start=start)


def strip_call_commands(text: str) -> str:
    """Remove every `<call>…</call>` command and a trailing unclosed `<call>…` fragment.

    Builds the teacher's view of the policy's text, which must never show call
    commands. Like a non-greedy regex, a command runs from the earliest open `<call>` to
    the nearest `</call>`. Unlike a regex, a tag that only forms once a command is cut
    out (`<ca<call>1</call>ll>`) is also caught, and the work stays linear in the text.
    """
    out: list[str] = []  # kept characters
    opens: list[int] = []  # positions in `out` of `<call>` tags not yet closed
    pos = 0
    while pos < len(text):
        # Both tags end in `>`, so the tail only needs checking after each `>`.
        gt = text.find(">", pos)
        stop = len(text) if gt < 0 else gt + 1
        out.extend(text[pos:stop])
        pos = stop
        if gt < 0:
            break
        tail = "".join(out[-len(CALL_CLOSE) :])
        if tail.endswith(CALL_OPEN):
            opens.append(len(out) - len(CALL_OPEN))
        elif tail == CALL_CLOSE and opens:
            del out[opens[0] :]
            opens.clear()
    if opens:
        del out[opens[0] :]
    return "".join(out)


# ----------------------------------------------------------------------------- answer text


def strip_blocks(text: str, *tags: tuple[str, str]) -> str:
    """`text` without its `OPEN…CLOSE` blocks, for each (OPEN, CLOSE) pair in `tags`.

    What a policy writes inside a call block is a question (or code) for someone else,
    and a returns block it writes itself is an invented reply: neither is its answer,
    so answers are read from what is left. A block runs from its opening tag to the
    nearest close; one left open (cut by the token budget) runs to the end of `text`.
    """
    if not tags:
        return text
    alternatives = "|".join(
        re.escape(open_) + r".*?(?:" + re.escape(close) + r"|\Z)" for open_, close in tags
    )
    return re.sub(alternatives, "", text, flags=re.DOTALL)


# ----------------------------------------------------------------------------- EAPO


@dataclass(frozen=True)
class ExpertQuery:
    expert_id: int  # 1-based, as the prompt numbers the experts
    query: str


@dataclass(frozen=True)
class AgentCalls:
    """The valid queries of the last `<agent_calls>` block, and what was wrong with it."""

    queries: tuple[ExpertQuery, ...]
    errors: tuple[str, ...]
    start: int  # index in the text where the last `<agent_calls>` begins

    @property
    def ok(self) -> bool:
        return bool(self.queries) and not self.errors


def _strip_fence(body: str) -> str:
    """Drop a Markdown code fence (```json … ```) that models like to wrap JSON in."""
    fence = _FENCE_LANG_RE.match(body)
    if fence is not None:
        body = body[fence.end() :]
        if body.endswith("```"):
            body = body[:-3]
    return body.strip()


def _load_json(body: str) -> tuple[object, str | None]:
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc.msg} at char {exc.pos}"
    except RecursionError:
        return None, "invalid JSON: nested too deeply"
    except ValueError as exc:  # e.g. an integer past Python's int/str digit limit
        return None, f"invalid JSON: {str(exc)[:80]}"


def _expert_id(value: object) -> int | None:
    # bool is a subclass of int, but `true` is no expert id.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _ID_STRING_RE.fullmatch(value.strip()):
        return int(value.strip())
    return None


def _parse_item(item: object, num_experts: int) -> ExpertQuery | str:
    """One call as an ExpertQuery, or the reason it is invalid."""
    if not isinstance(item, dict):
        return "not an object"
    if "expert_id" not in item:
        return "missing expert_id"
    expert_id = _expert_id(item["expert_id"])
    if expert_id is None:
        return f"expert_id is not an integer: {_short(item['expert_id'])}"
    if not 1 <= expert_id <= num_experts:
        return f"unknown expert id {_short(expert_id)}"
    params = item.get("input_parameters")
    if params is None:
        return "missing input_parameters"
    if not isinstance(params, dict):
        return "input_parameters is not an object"
    if "query" not in params:
        return "missing query"
    query = params["query"]
    if not isinstance(query, str):
        return "query is not a string"
    if not query.strip():
        return "empty query"
    return ExpertQuery(expert_id=expert_id, query=query.strip())


def format_agent_calls(queries: Sequence[ExpertQuery]) -> str:
    """The block a policy writes to ask experts: `<agent_calls>`, the JSON list of
    `{"expert_id": k, "input_parameters": {"query": …}}` items on its own line, then
    `</agent_calls>`, laid out as in the training prompt's example (EAPO appendix D).
    `parse_agent_calls` reads it back to the same queries, their text stripped: a tag
    inside a query is written with its `<` as the JSON escape `\\u003c`, so it cannot
    open or close the block."""
    items = [{"expert_id": q.expert_id, "input_parameters": {"query": q.query}} for q in queries]
    body = json.dumps(items, ensure_ascii=False)
    for tag in (AGENT_CALLS_OPEN, AGENT_CALLS_CLOSE):
        body = body.replace(tag, "\\u003c" + tag[1:])
    return f"{AGENT_CALLS_OPEN}\n{body}\n{AGENT_CALLS_CLOSE}"


def parse_agent_calls(text: str, num_experts: int, max_calls: int) -> AgentCalls | None:
    """Parse the last `<agent_calls>` block; None when no `<agent_calls>` appears at all.

    Invalid items are skipped with one error each; valid ones beyond `max_calls` are
    dropped with an error, keeping the first `max_calls`.
    """
    _check_positive("num_experts", num_experts)
    _check_positive("max_calls", max_calls)
    start = text.rfind(AGENT_CALLS_OPEN)
    if start < 0:
        return None
    body_start = start + len(AGENT_CALLS_OPEN)
    close = text.find(AGENT_CALLS_CLOSE, body_start)
    if close < 0:
        return AgentCalls(queries=(), errors=("unclosed <agent_calls>",), start=start)
    body = _strip_fence(text[body_start:close].strip())
    if not body:
        return AgentCalls(queries=(), errors=("empty <agent_calls>",), start=start)
    data, error = _load_json(body)
    if error is not None:
        return AgentCalls(queries=(), errors=(error,), start=start)
    items = [data] if isinstance(data, dict) else data
    if not isinstance(items, list):
        return AgentCalls(queries=(), errors=("not a list of calls",), start=start)
    if not items:
        return AgentCalls(queries=(), errors=("empty list of calls",), start=start)
    queries: list[ExpertQuery] = []
    errors: list[str] = []
    for number, item in enumerate(items, start=1):
        parsed = _parse_item(item, num_experts)
        if isinstance(parsed, str):
            errors.append(f"item {number}: {parsed}")
        else:
            queries.append(parsed)
    if len(queries) > max_calls:
        errors.append(f"too many calls: {len(queries)} > {max_calls}")
        queries = queries[:max_calls]
    return AgentCalls(queries=tuple(queries), errors=tuple(errors), start=start)


def agent_returns_pieces(results: list[tuple[int, str | None]]) -> list[str]:
    """The `<agent_returns>` block cut by author: 2n+1 pieces — scaffolding, result 1,
    scaffolding, …, result n, scaffolding.

    A result piece is the expert's text as a JSON string body (escaped, no quotes); a
    None result's piece is empty and its "unavailable" belongs to the scaffolding, since
    no expert wrote it. The layout is `json.dumps` of the list of
    `{"expert_id": i, "result": …}` objects with `ensure_ascii=False`.
    """
    pieces: list[str] = []
    scaffold = AGENT_RETURNS_OPEN + "["
    for number, (expert_id, result) in enumerate(results):
        scaffold += (
            ", " if number else ""
        ) + f'{{"expert_id": {json.dumps(expert_id)}, "result": "'
        if result is None:
            pieces += [scaffold, ""]
            scaffold = "unavailable"
        else:
            pieces += [scaffold, json.dumps(result, ensure_ascii=False)[1:-1]]
            scaffold = ""
        scaffold += '"}'
    pieces.append(scaffold + "]" + AGENT_RETURNS_CLOSE)
    return pieces


# ----------------------------------------------------------------------------- AlphaApollo

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
# The atomic group keeps the match linear: `\s*\n` alone would retry the body scan
# from every newline of a whitespace run when no closing fence follows (quadratic on
# "```" and 64k newlines), and the whitespace holds no backtick, so no retry could
# find a closing fence the last newline's scan missed.
_CODE_FENCE_RE = re.compile(r"```(?:python|py)?(?>\s*\n)(.*?)```", re.DOTALL)


def code_blocks(text: str) -> list[str]:
    """The bodies of `text`'s fenced code blocks tagged python/py or untagged, in order."""
    return _CODE_FENCE_RE.findall(text)


@dataclass(frozen=True)
class ToolCall:
    """The policy's tool call: a tool name and its arguments, or why none could be read.

    `lenient` marks a call read from code instead of the JSON the prompt asks for
    (a fenced or bare Python block inside the tags): small models write that often,
    and it is unambiguous when a `python` tool is offered.
    """

    name: str | None
    arguments: dict[str, object]
    error: str | None = None
    lenient: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.name is not None


def parse_tool_call(text: str, code_tool: str | None = None) -> ToolCall:
    """The call in the last `<tool_call>…</tool_call>` block of `text`, which generation
    stopped at the close tag.

    The body is `{"name": …, "arguments": {…}}` (arguments may also be a JSON string,
    as some chat templates write them). When it is not JSON and `code_tool` names a
    tool taking `code`, a fenced or bare code body is a call of that tool.
    """
    end = text.rstrip()
    if not end.endswith(TOOL_CALL_CLOSE):
        return ToolCall(None, {}, error=f"no {TOOL_CALL_CLOSE}")
    start = end.rfind(TOOL_CALL_OPEN)
    if start < 0:
        return ToolCall(None, {}, error=f"{TOOL_CALL_CLOSE} without {TOOL_CALL_OPEN}")
    body = end[start + len(TOOL_CALL_OPEN) : len(end) - len(TOOL_CALL_CLOSE)].strip()
    if not body:
        return ToolCall(None, {}, error="empty tool call")
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return _code_call(body, code_tool)
    return _json_call(value)


def _json_call(value: object) -> ToolCall:
    if not isinstance(value, dict):
        return ToolCall(None, {}, error='a tool call is a JSON object {"name": …, "arguments": …}')
    name, arguments = value.get("name"), value.get("arguments", {})
    if not isinstance(name, str) or not name:
        return ToolCall(None, {}, error='the tool call has no "name"')
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return ToolCall(name, {}, error='"arguments" is not a JSON object')
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, error='"arguments" is not a JSON object')
    return ToolCall(name, arguments)


def _code_call(body: str, code_tool: str | None) -> ToolCall:
    # A body opening with `{` is JSON gone wrong, not code: running it would evaluate
    # the call itself as a Python dict.
    if code_tool is None or body.startswith("{"):
        return ToolCall(None, {}, error="the tool call is not valid JSON")
    fenced = _CODE_FENCE_RE.search(body)
    code = fenced.group(1) if fenced else body
    return ToolCall(code_tool, {"code": code}, lenient=True)
