"""MCP both ways, with real servers in subprocesses and real clients: the SDK's own
client against our server, our client against our server and against a server that
is not ours (the SDK's MCPServer, defined below).

This file is also the servers' script: `python test_mcp.py ours stdio|http` serves
the small tools below through `serve_tools` (over HTTP, requiring the key KEY), and
`python test_mcp.py foreign` serves an MCPServer tool set.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from collabrl.errors import UserError
from collabrl.tools.base import ToolResult, ToolSpec, bad_arguments
from collabrl.tools.mcp_client import MCPServerConfig, ToolRouter, connect, parse_server

pytestmark = pytest.mark.timeout(60)

OURS_STDIO = f"stdio:{sys.executable} {__file__} ours stdio"
KEY = "test-key"
FOREIGN_STDIO = f"stdio:{sys.executable} {__file__} foreign"


class Arithmetic:
    """A real tool: `op` applied to two numbers, failing the way model mistakes fail."""

    def __init__(self, name: str, op: str) -> None:
        self.op = op
        self.spec = ToolSpec(
            name,
            f"Compute a {op} b.",
            {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        )

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        a, b = arguments.get("a"), arguments.get("b")
        if not all(isinstance(x, int | float) for x in (a, b)):
            return bad_arguments(self.spec, "a and b must be numbers")
        try:
            return ToolResult(str(eval(f"{a} {self.op} {b}")))
        except ArithmeticError as exc:
            return ToolResult(str(exc), error=type(exc).__name__)

    def close(self) -> None:
        pass


class Sleep:
    """Sleeps, then says its process id: for timeouts, concurrency and process checks."""

    spec = ToolSpec(
        "sleep",
        "Sleep for `seconds`, then return this server's process id.",
        {"type": "object", "properties": {"seconds": {"type": "number"}}},
    )

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        time.sleep(arguments.get("seconds", 0))
        return ToolResult(str(os.getpid()))

    def close(self) -> None:
        pass


def our_tools() -> list:
    return [Arithmetic("add", "+"), Arithmetic("divide", "/"), Sleep()]


def serve_foreign() -> None:
    """An MCP server written with the SDK alone, as a third party would."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("foreign")

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    @server.tool()
    def fail() -> str:
        """Always fails, the way MCPServer tools report a failure."""
        raise ToolError("broken on purpose")

    server.run("stdio")


# ---- fixtures: servers in subprocesses ---------------------------------------------


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """Our server over streamable HTTP on a free port; its URL once it says ready."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "ours", "http"], stderr=subprocess.PIPE, text=True
    )
    ready: list[str] = []
    seen: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("ready: "):
                ready.append(line.removeprefix("ready: ").strip())

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 30
    while not ready and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert ready, "server did not start:\n" + "".join(seen)
        yield ready[0]
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def ours():
    connection = connect(parse_server(OURS_STDIO))
    yield connection
    connection.close()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ---- the SDK's own client against our server ---------------------------------------


async def check_with_sdk_session(session: Any) -> None:
    await session.initialize()
    listing = await session.list_tools()
    by_name = {t.name: t for t in listing.tools}
    assert sorted(by_name) == ["add", "divide", "sleep"]
    assert by_name["add"].input_schema == Arithmetic("add", "+").spec.parameters
    assert by_name["add"].description == "Compute a + b."

    ok = await session.call_tool("add", {"a": 2, "b": 3})
    assert not ok.is_error and ok.content[0].text == "5"

    failed = await session.call_tool("divide", {"a": 1, "b": 0})
    assert failed.is_error and "division by zero" in failed.content[0].text
    assert failed.meta == {"collabrl/error": "ZeroDivisionError"}

    bad = await session.call_tool("add", {"a": "two"})
    assert bad.is_error and bad.content[0].text == "add: a and b must be numbers"

    unknown = await session.call_tool("nope", {})
    assert unknown.is_error and "available: add, divide, sleep" in unknown.content[0].text


def test_sdk_client_calls_our_server_over_stdio():
    from mcp import ClientSession, StdioServerParameters, stdio_client

    async def main() -> None:
        params = StdioServerParameters(command=sys.executable, args=[__file__, "ours", "stdio"])
        with anyio.fail_after(30):
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as session:
                    await check_with_sdk_session(session)

    anyio.run(main)


def test_sdk_client_calls_our_server_over_http(http_url: str):
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> None:
        with anyio.fail_after(30):
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"})
            async with http, streamable_http_client(http_url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await check_with_sdk_session(session)

    anyio.run(main)


# ---- our client ---------------------------------------------------------------------


def test_our_client_lists_and_calls_our_server(ours):
    assert [t.spec for t in ours.tools] == [t.spec for t in our_tools()]
    add, divide, _ = ours.tools
    assert add.call({"a": 2, "b": 3}) == ToolResult("5")
    # The failure kind survives the trip, so metrics can count it.
    assert divide.call({"a": 1, "b": 0}).error == "ZeroDivisionError"
    assert add.call({"a": "two"}).error == "bad_arguments"


def test_our_client_over_http(http_url: str):
    connection = connect(MCPServerConfig(url=http_url, bearer_token=KEY))
    try:
        assert [t.spec.name for t in connection.tools] == ["add", "divide", "sleep"]
        assert connection.call_tool("add", {"a": 0.5, "b": 1}) == ToolResult("1.5")
    finally:
        connection.close()


def test_calls_from_many_threads_share_one_connection(ours):
    """A batch calls from several threads at once; the calls must overlap, not queue."""
    sleep = ours.tools[2]
    results: list[ToolResult] = []
    threads = [
        threading.Thread(target=lambda: results.append(sleep.call({"seconds": 1.0})))
        for _ in range(6)
    ]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 6 and all(r.ok for r in results)
    assert time.monotonic() - start < 4  # six one-second calls, run together


def test_our_client_calls_a_foreign_server():
    connection = connect(parse_server(FOREIGN_STDIO))
    try:
        shout, fail = connection.tools
        assert shout.spec.name == "shout" and shout.spec.description == "Upper-case the text."
        assert shout.spec.parameters["required"] == ["text"]
        assert shout.call({"text": "hi"}) == ToolResult("HI")
        failed = fail.call({})
        assert failed.error == "tool_error" and "broken on purpose" in failed.text
    finally:
        connection.close()


def test_a_slow_call_times_out_and_the_connection_survives():
    config = parse_server(OURS_STDIO)
    config.name, config.timeout = "slow", 1
    connection = connect(config)
    try:
        start = time.monotonic()
        slow = connection.call_tool("sleep", {"seconds": 2.5})
        assert slow.error == "unavailable" and "slow" in slow.text
        assert time.monotonic() - start < 2.4
        assert connection.call_tool("add", {"a": 1, "b": 1}) == ToolResult("2")
    finally:
        connection.close()


def test_a_lost_session_is_reopened_once_and_close_still_cleans_up():
    threads_before = set(threading.enumerate())
    connection = connect(parse_server(OURS_STDIO))
    first = int(connection.call_tool("sleep", {}).text)
    os.kill(first, signal.SIGKILL)
    # The call that finds the session lost opens a new one (a new server) and is answered.
    assert connection.call_tool("add", {"a": 1, "b": 1}) == ToolResult("2")
    second = int(connection.call_tool("sleep", {}).text)
    assert second != first
    connection.close()
    assert gone(second)
    assert set(threading.enumerate()) <= threads_before
    # After close, a call is still an answer the model can read, not an exception.
    assert connection.call_tool("add", {"a": 1, "b": 1}).error == "unavailable"


def test_a_server_that_cannot_come_back_makes_calls_unavailable(tmp_path):
    # The server runs from a copy of this file, removed once it is up: after a kill,
    # reconnecting fails, and the call is answered "unavailable", not raised.
    script = tmp_path / "server.py"
    script.write_text(Path(__file__).read_text())
    config = parse_server(f"stdio:{sys.executable} {script} ours stdio")
    config.connect_timeout = 10
    connection = connect(config)
    try:
        script.unlink()
        os.kill(int(connection.call_tool("sleep", {}).text), signal.SIGKILL)
        assert connection.call_tool("add", {"a": 1, "b": 1}).error == "unavailable"
    finally:
        connection.close()


def test_a_lone_surrogate_is_refused_and_the_session_goes_on():
    # JSON's "\ud800" escape reaches a call as a lone surrogate; sent, it broke the
    # transport's encoder and closed the session for every later call.
    connection = connect(parse_server(OURS_STDIO))
    try:
        refused = connection.call_tool("add", {"a": "\ud800", "b": 1})
        assert refused.error == "bad_arguments" and "lone surrogate" in refused.text
        assert connection.call_tool("add", {"a": 1, "b": 1}) == ToolResult("2")
    finally:
        connection.close()


@pytest.mark.parametrize(
    "server",
    [
        "stdio:/no/such/server",
        # Starts, but never speaks MCP: start-up must time out, and the process go.
        f"stdio:{sys.executable} -c 'import time; time.sleep(60)'",
    ],
)
def test_a_server_that_cannot_connect_is_a_user_error(server: str):
    threads_before = set(threading.enumerate())
    config = parse_server(server)
    config.connect_timeout = 1
    with pytest.raises(UserError, match="cannot connect to MCP server 'stdio:"):
        connect(config)
    assert set(threading.enumerate()) <= threads_before


@pytest.mark.parametrize("token", [None, "wrong-key"])
def test_our_http_server_refuses_a_missing_or_wrong_key(http_url: str, token: str | None):
    with pytest.raises(UserError, match="cannot connect.*missing or wrong API key"):
        connect(MCPServerConfig(url=http_url, bearer_token=token, connect_timeout=10))


def test_our_http_server_refuses_a_body_over_its_cap_and_serves_on(http_url: str):
    """A request far larger than any tool call is answered 413 on its headers, before a
    byte of its body is read (none is sent here: the server must not wait for it)."""
    import http.client
    from urllib.parse import urlsplit

    from collabrl.tools.mcp_server import MAX_REQUEST_BYTES

    url = urlsplit(http_url)
    client = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    client.putrequest("POST", url.path)
    client.putheader("Authorization", f"Bearer {KEY}")
    client.putheader("Content-Type", "application/json")
    client.putheader("Content-Length", str(MAX_REQUEST_BYTES + 1))
    client.endheaders()
    assert client.getresponse().status == 413
    client.close()
    connection = connect(MCPServerConfig(url=http_url, bearer_token=KEY))
    try:
        assert connection.call_tool("add", {"a": 1, "b": 1}) == ToolResult("2")
    finally:
        connection.close()


def test_an_unreachable_url_is_a_user_error():
    with pytest.raises(UserError, match="127.0.0.1:9/mcp': ConnectError"):
        connect(MCPServerConfig(url="http://127.0.0.1:9/mcp", connect_timeout=5))


# ---- server strings -----------------------------------------------------------------


def test_parse_server():
    stdio = parse_server("stdio:python -m pkg.server --flag 'two words'")
    assert stdio.command == ["python", "-m", "pkg.server", "--flag", "two words"]
    assert stdio.url == "" and stdio.name == "stdio:python -m pkg.server --flag 'two words'"
    assert parse_server("https://tools.example/mcp").url == "https://tools.example/mcp"
    for bad in ["python -m pkg.server", "stdio:", "ftp://host/mcp", ""]:
        with pytest.raises(UserError):
            parse_server(bad)


# ---- the router ---------------------------------------------------------------------


def test_router_routes_by_name_across_local_tools_and_servers():
    servers = [parse_server(OURS_STDIO), parse_server(FOREIGN_STDIO)]
    router = ToolRouter.connect([Arithmetic("multiply", "*")], servers)
    try:
        names = [s.name for s in router.specs()]
        assert names == ["multiply", "add", "divide", "sleep", "shout", "fail"]
        assert router.call("multiply", {"a": 3, "b": 4}) == ToolResult("12")
        assert router.call("add", {"a": 3, "b": 4}) == ToolResult("7")
        assert router.call("shout", {"text": "ok"}) == ToolResult("OK")
        unknown = router.call("search", {})
        assert unknown.error == "unknown_tool" and "multiply, add, divide" in unknown.text
        pid = int(router.call("sleep", {}).text)
    finally:
        router.close()
    assert gone(pid)


def test_router_refuses_two_tools_with_one_name(ours):
    with pytest.raises(UserError, match="two tools are named 'add'.*local.*MCP server"):
        ToolRouter([Arithmetic("add", "+")], [ours])


def test_router_connect_closes_what_it_opened_when_one_server_fails():
    threads_before = set(threading.enumerate())
    with pytest.raises(UserError, match="no/such"):
        ToolRouter.connect([], [parse_server(FOREIGN_STDIO), parse_server("stdio:/no/such")])
    assert set(threading.enumerate()) <= threads_before


if __name__ == "__main__":
    from collabrl.tools.mcp_server import serve_tools

    if sys.argv[1] == "foreign":
        serve_foreign()
    else:
        announce = lambda address: print(f"ready: {address}", file=sys.stderr, flush=True)  # noqa: E731
        serve_tools(our_tools(), sys.argv[2], port=0, api_key=KEY, on_ready=announce)
