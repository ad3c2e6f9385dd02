"""The one small interface every tool implements, local or behind an MCP server.

A tool is described by a `ToolSpec` (what the model is told: name, description,
JSON-schema parameters) and called with the model's arguments. A call never raises
for anything the *model* got wrong — bad arguments, code that crashes, a limit hit:
those come back as a `ToolResult` with `error` set, because the model is meant to
read them and try again. Exceptions are for the operator's mistakes (a missing
index, an unreachable server at start-up), raised as `UserError`. `call_safely`,
where the protocols and the MCP server call tools, keeps that promise for any tool:
an exception still escaping a call becomes an error result, logged, not a lost batch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

# What a tool's output must not carry into episode text, transcripts and terminals:
# C0 controls but newline and tab, DEL and C1 (ESC sequences, BEL, NUL, CR), the bidi
# marks, embeddings, overrides and isolates that reorder what a reader sees (RLO), and
# lone surrogates, which no UTF-8 file, tokenizer or JSON encoder takes.
UNPRINTABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    # JSON schema of the arguments object, as MCP and OpenAI tool schemas write it.
    parameters: dict[str, Any] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes function schema (what chat templates' `tools=` take)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass
class ToolResult:
    """What a call returned: the text the model reads, and whether it failed.

    `error` names the failure kind when there is one: a Python exception name
    ("NameError"), a limit ("wall_time", "memory", "output", …), "bad_arguments",
    "unknown_tool", "unavailable", "too_long", "internal" (the tool itself failed; see
    `call_safely`). Metrics count calls with `error` set.
    """

    text: str
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


class Tool(Protocol):
    """A callable tool: its spec, a call, and its resources released by `close`."""

    spec: ToolSpec

    def call(self, arguments: dict[str, Any]) -> ToolResult: ...

    def close(self) -> None: ...


def bad_arguments(spec: ToolSpec, message: str) -> ToolResult:
    """The result of a call whose arguments do not fit the tool's schema."""
    return ToolResult(f"{spec.name}: {message}", error="bad_arguments")


def printable(text: str) -> str:
    """`text` with each control, bidi or surrogate character written as its escape
    (`\\x1b`, `\\u202e`): the reader still sees that the output held one."""
    return UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def not_text(arguments: dict[str, Any]) -> str | None:
    """Why `arguments` cannot be sent or run as UTF-8 text, or None when they can.

    JSON's `\\ud800` escape writes a lone surrogate, which is no character: a source
    file, a pipe or an MCP message cannot carry it, and its encoder raises."""
    try:
        json.dumps(arguments, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        found = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        return f"the arguments hold {found}, a lone surrogate that is not text"
    return None


def call_safely(tool: Tool, arguments: dict[str, Any]) -> ToolResult:
    """`tool.call`, kept to the contract: any exception becomes an `internal` error
    result that names it (and is logged with its traceback), and the text the model
    reads is `printable`. The model's code must never end a run, whatever the tool."""
    try:
        result = tool.call(arguments)
    except Exception as exc:  # not BaseException: Ctrl-C and SystemExit still stop the run
        log.warning("tool %s raised on a call; answered as an error", tool.spec.name, exc_info=exc)
        text = printable(f"{tool.spec.name}: the tool failed ({describe(exc)})")
        return ToolResult(text, error="internal", meta={"exception": type(exc).__name__})
    return dataclasses.replace(result, text=printable(result.text))


def describe(exc: BaseException) -> str:
    """The exception that says what went wrong, not the task groups it surfaced through."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
