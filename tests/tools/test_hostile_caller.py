"""Hostile model-written calls against the *caller* of the tools (issue 33).

The sandbox keeps code from reaching the host; these snippets aim at what runs
before and after it on the trainer's side: the correction step, the encoding of
the source, the text the policy reads back, and the MCP session. Each is called
exactly as the apollo protocol calls a tool (`build_router(...).call`), and must
come back as a `ToolResult` the policy can read; nothing may raise.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from collabrl.errors import UserError
from collabrl.protocols.apollo import ApolloConfig, build_router
from collabrl.tools.base import ToolResult, ToolSpec, not_text, printable
from collabrl.tools.mcp_client import ToolRouter, connect, parse_server
from collabrl.tools.python import PythonTool, PythonToolConfig
from collabrl.tools.sandbox import Sandbox, SandboxLimits

LIMITS = SandboxLimits(cpu_seconds=5, wall_seconds=10, memory_mb=2048)

# A few dozen tokens each (a run of dashes is one token in most vocabularies), yet
# past the depth at which this process's compiler raises RecursionError/MemoryError
# instead of SyntaxError (about 3000 levels on CPython 3.11).
DEPTH = 10_000
CRASHES = {
    # JSON's "\ud800" escape: a lone surrogate, which no UTF-8 pipe or file carries.
    "lone_surrogate": "print('\ud800')",
    "deep_unary": "print(" + "-" * DEPTH + "1)",
    "deep_not": "print(" + "not " * DEPTH + "1)",
    "deep_lambda": "f = " + "lambda: " * DEPTH + "1",
    "deep_lambda_bare": "lambda: " * DEPTH + "1",  # the last-expression rule's path
}

# Characters that rewrite a terminal or reorder what a reader sees, as printed output.
CONTROL = "\x1b[2J\x1b]0;title\x07\x00\r\x9b\u202e\u2066\x7f"
CONTROL_CODE = f"print({CONTROL!r} + 'end')\nprint('a\\tb')"


@pytest.fixture(scope="module")
def router() -> ToolRouter:
    config = ApolloConfig(tools=["python"], python=PythonToolConfig(sandbox=LIMITS))
    router = build_router(config)
    yield router
    router.close()


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    return PythonTool(Sandbox(LIMITS))


def assert_readable(result: ToolResult) -> None:
    """A result the policy can read, and write into an episode's UTF-8 text."""
    assert isinstance(result, ToolResult)
    assert result.text.strip()
    result.text.encode()  # no surrogate left
    assert printable(result.text) == result.text


@pytest.mark.parametrize("code", CRASHES.values(), ids=CRASHES.keys())
def test_a_crash_snippet_is_an_error_result_as_apollo_calls_it(router, code):
    result = router.call("python", {"code": code})
    assert_readable(result)
    # Handled by the tool itself (refused, or reported by the sandbox's compiler),
    # not only caught by the last-resort guard.
    assert result.error not in (None, "internal"), result


@pytest.mark.parametrize("code", CRASHES.values(), ids=CRASHES.keys())
def test_a_crash_snippet_does_not_raise_out_of_the_tool_itself(tool, code):
    assert_readable(tool.call({"code": code}))


def test_a_lone_surrogate_is_refused_with_a_reason(tool):
    result = tool.call({"code": CRASHES["lone_surrogate"]})
    assert result.error == "bad_arguments"
    assert "\\ud800" in result.text and "lone surrogate" in result.text


def test_not_text_finds_a_surrogate_anywhere_in_the_arguments():
    assert not_text({"code": "print('é 中 🙂')"}) is None
    assert "\\udfff" in not_text({"a": {"b": ["\udfff"]}})


def test_code_over_the_size_cap_is_refused_before_correction(router):
    start = time.monotonic()
    result = router.call("python", {"code": "x = 1\n" * (4 * 2**20 // 6)})  # 4 MB
    assert result.error == "too_long" and "over the limit of 65536" in result.text
    assert time.monotonic() - start < 2  # uncapped, correction alone took ~20 s
    assert "isolation" not in result.meta  # nothing ran


def test_the_size_cap_is_a_config_value_counted_in_bytes():
    tool = PythonTool(Sandbox(LIMITS), max_code_bytes=21)
    assert tool.call({"code": "print('ééééééé')"}).error == "too_long"  # 16 chars, 23 bytes
    assert tool.call({"code": "print('éééééé')"}).text == "éééééé"  # 21 bytes
    with pytest.raises(UserError, match="max_code_bytes must be >= 1"):
        PythonToolConfig(max_code_bytes=0).check()


def test_control_characters_in_output_reach_the_policy_escaped(router):
    result = router.call("python", {"code": CONTROL_CODE})
    assert result.ok, result
    assert result.text.splitlines() == [
        "\\x1b[2J\\x1b]0;title\\x07\\x00\\r\\x9b\\u202e\\u2066\\x7fend",
        "a\tb",  # newline and tab are text
    ]


def test_printable_escapes_each_control_and_keeps_text():
    assert printable("é 中\n\t🙂") == "é 中\n\t🙂"
    assert printable("\x1b\x07\x00\x85\u200f\u061c\ud800") == (
        "\\x1b\\x07\\x00\\x85\\u200f\\u061c\\ud800"
    )


class Broken:
    """A tool with a bug of its own: whatever the model sends, the call raises."""

    spec = ToolSpec("broken", "Always raises.", {"type": "object", "properties": {}})

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        raise RuntimeError("bug \x1b[2J in the tool")

    def close(self) -> None:
        pass


def test_a_tool_that_raises_is_an_internal_error_result_and_logged(caplog):
    router = ToolRouter([Broken()])
    with caplog.at_level("WARNING", logger="collabrl.tools.base"):
        result = router.call("broken", {})
    assert result.error == "internal" and result.meta == {"exception": "RuntimeError"}
    assert result.text == "broken: the tool failed (RuntimeError: bug \\x1b[2J in the tool)"
    assert "tool broken raised" in caplog.text and "RuntimeError" in caplog.text


def test_the_retrieve_tool_echoes_hostile_queries_escaped(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path))
    router = build_router(ApolloConfig(tools=["retrieve"]))
    try:
        for query in ("\x1b[2J\u202ezzqx", "\ud800 zzqx", "zzqx " * 200_000):
            result = router.call("retrieve", {"repo_name": "fractions", "query": query})
            assert_readable(result)
    finally:
        router.close()


# ---- the same snippets over MCP, through the real server -----------------------------


def test_crash_snippets_over_mcp_leave_the_session_working():
    server = f"stdio:{sys.executable} -m collabrl.tools.mcp_server --tools python"
    connection = connect(parse_server(server))
    try:
        for name, code in CRASHES.items():
            result = connection.call_tool("python", {"code": code})
            assert result.error not in (None, "unavailable", "internal"), (name, result)
            assert connection.call_tool("python", {"code": "print(6 * 7)"}).text == "42", name
        too_long = connection.call_tool("python", {"code": "#" * 70_000})
        assert too_long.error == "too_long"  # the server's python tool has the cap too
        shown = connection.call_tool("python", {"code": CONTROL_CODE})
        assert shown.text.startswith("\\x1b[2J")
    finally:
        connection.close()
