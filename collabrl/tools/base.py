"""The one small interface every tool implements, local or behind an MCP server.

A tool is described by a `ToolSpec` (what the model is told: name, description,
JSON-schema parameters) and called with the model's arguments. A call never raises
for anything the *model* got wrong — bad arguments, code that crashes, a limit hit:
those come back as a `ToolResult` with `error` set, because the model is meant to
read them and try again. Exceptions are for the operator's mistakes (a missing
index, an unreachable server at start-up), raised as `UserError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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
    "unknown_tool", "unavailable". Metrics count calls with `error` set.
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
