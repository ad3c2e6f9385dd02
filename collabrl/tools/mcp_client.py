"""Call any MCP server's tools as collabrl `Tool`s, and route calls by tool name.

This is AlphaApollo's manager/client split (§2.1): a `ToolRouter` (the manager) holds
local tools and one `MCPConnection` (a client) per MCP server, and sends each
`<tool_call>` to whichever of them has a tool of that name.

The SDK's client is async; rollouts are synchronous and call tools from several
threads at once. So each connection runs its session on its own event-loop thread
(an anyio blocking portal) and offers thread-safe, blocking methods. One session
carries concurrent calls: MCP requests are multiplexed by id. A session that is lost
(the server died, or its transport broke) is opened anew once, by the first call that
finds it lost, so one bad moment does not leave every later call "unavailable".
"""

from __future__ import annotations

import logging
import math
import shlex
import threading
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import mcp_types as types
from anyio.abc import TaskStatus
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client, StdioServerParameters
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from collabrl.config import option
from collabrl.errors import UserError
from collabrl.tools.base import Tool, ToolResult, ToolSpec, call_safely, describe, not_text

log = logging.getLogger(__name__)

# Where our server puts a failed result's kind ("NameError", "wall_time", …), so that
# metrics count failures by kind across MCP too; other servers only set `isError`.
ERROR_META_KEY = "collabrl/error"


@dataclass
class MCPServerConfig:
    """One MCP server: a command to launch (stdio) or a URL (streamable HTTP)."""

    name: str = option("", "Name shown in errors (default: the URL or the command).")
    command: list[str] = option([], "stdio: the command launching the server, and its args.")
    env: dict[str, str] = option(
        {}, "stdio: extra environment variables (the SDK passes only PATH, HOME and a few more)."
    )
    url: str = option("", "Streamable HTTP: the endpoint URL, e.g. http://host:8931/mcp.")
    headers: dict[str, str] = option({}, "Streamable HTTP: extra headers sent with every request.")
    bearer_token: str | None = option(None, "Streamable HTTP: sent as `Authorization: Bearer`.")
    timeout: float = option(60.0, "Seconds a call may take; then it fails as `unavailable`.")
    connect_timeout: float = option(
        60.0, "Seconds the server may take to start (loading an index can be slow)."
    )


def parse_server(text: str) -> MCPServerConfig:
    """`stdio:COMMAND ARGS…` or `http(s)://HOST:PORT/PATH`, the form configs and the CLI take."""
    if text.startswith("stdio:"):
        command = shlex.split(text.removeprefix("stdio:"))
        if not command:
            raise UserError(f"MCP server '{text}' has no command", "write stdio:COMMAND ARGS")
        return MCPServerConfig(name=text, command=command)
    if text.startswith(("http://", "https://")):
        return MCPServerConfig(name=text, url=text)
    raise UserError(
        f"'{text}' is not an MCP server",
        "write stdio:COMMAND ARGS (launched here) or http(s)://HOST:PORT/PATH",
    )


class MCPConnection:
    """An initialized session with one MCP server, and one `MCPTool` per remote tool."""

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.name = config.name or config.url or shlex.join(config.command) or "unnamed"
        if bool(config.command) == bool(config.url):
            raise UserError(
                f"MCP server '{self.name}' needs exactly one of a command and a URL",
                "write stdio:COMMAND ARGS or http(s)://HOST:PORT/PATH",
            )
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = start_blocking_portal(
            name=f"mcp {self.name}"
        )
        self._portal = self._portal_cm.__enter__()
        self._stop: anyio.Event | None = None
        self._session: Future[None] | None = None
        # Calls that lost one session wait for one new session, not one each.
        self._reconnecting = threading.Lock()
        self._generation = 0
        try:
            self._open()
            listing = self._portal.call(self._list_tools)
        except Exception as exc:
            self.close()
            raise UserError(
                f"cannot connect to MCP server '{self.name}': {describe(exc)}",
                "check the command or URL, and that the server starts on its own",
            ) from exc
        self.tools = [MCPTool(_spec(t), self) for t in listing]

    def _open(self) -> None:
        """Start a session (the task `_hold`) and wait until it is initialized."""
        self._session, self._client = self._portal.start_task(self._hold)

    def _end(self) -> None:
        """Stop the session's task and wait until it has left the client."""
        if self._stop is not None:
            self._portal.call(self._stop.set)
        if self._session is not None:
            wait_for([self._session])

    def _reconnect(self, generation: int) -> bool:
        """Replace the session `generation` lost; True when a session is open again."""
        with self._reconnecting:
            if self._generation != generation:  # another call has reconnected already
                return True
            if self._portal_cm is None:  # closed
                return False
            self._end()
            try:
                self._open()
            except Exception as exc:
                log.warning("MCP server '%s': reconnecting failed: %s", self.name, describe(exc))
                return False
            self._generation += 1
            log.warning("MCP server '%s': the session was lost; reconnected", self.name)
            return True

    async def _hold(self, *, task_status: TaskStatus[Any]) -> None:
        """Open the session, hand it to `__init__`, keep it open until `close`.

        One task enters and exits the client: anyio's cancel scopes must be left by
        the task that entered them. This deadline bounds start-up only.
        """
        self._stop = anyio.Event()
        with anyio.fail_after(self.config.connect_timeout) as scope:
            async with _open_client(self.config) as client:
                scope.deadline = math.inf
                task_status.started(client)
                await self._stop.wait()

    async def _list_tools(self) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor = None
        while True:
            page = await self._client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                return tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call a remote tool; thread-safe, blocks for at most the config's timeout
        (twice, and a reconnection, when the session turns out to be lost)."""
        # What JSON cannot encode would break the transport, and the session with it.
        problem = not_text(arguments)
        if problem:
            return ToolResult(f"{name}: {problem}", error="bad_arguments")
        for retry in (False, True):
            generation = self._generation
            try:
                return to_tool_result(self._portal.call(self._client.call_tool, name, arguments))
            # Whatever stops an answer (a timeout, a dead server, a closed connection), the
            # model reads it as "unavailable" and the rollout goes on; it is never its bug.
            except Exception as exc:
                failure = exc
                if retry or not _lost(exc) or not self._reconnect(generation):
                    break
        return ToolResult(
            f"{name}: MCP server '{self.name}' unavailable: {describe(failure)}",
            error="unavailable",
        )

    def close(self) -> None:
        """End the session, stop the server process (stdio) and the loop thread."""
        with self._reconnecting:  # not while a call opens a new session
            if self._portal_cm is None:
                return
            # Waits for `_hold` to leave the client, which stops a stdio server's process.
            self._end()
            self._portal_cm.__exit__(None, None, None)
            self._portal_cm = None


@dataclass
class MCPTool:
    """A tool of an MCP server, called through its connection."""

    spec: ToolSpec
    connection: MCPConnection

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        return self.connection.call_tool(self.spec.name, arguments)

    def close(self) -> None:
        """Nothing: the connection is shared by the server's tools, and closed by its owner."""


def connect(config: MCPServerConfig) -> MCPConnection:
    """Start or reach the server, initialize a session, list its tools."""
    return MCPConnection(config)


@asynccontextmanager
async def _open_client(config: MCPServerConfig) -> AsyncIterator[Client]:
    async with AsyncExitStack() as stack:
        if config.url:
            headers = dict(config.headers)
            if config.bearer_token:
                headers["Authorization"] = f"Bearer {config.bearer_token}"
            http = await stack.enter_async_context(
                # No read timeout here: the session bounds each call, and the server's
                # event stream may rightly stay quiet for long.
                httpx2.AsyncClient(
                    headers=headers, timeout=httpx2.Timeout(config.timeout, read=None)
                )
            )
            server: Transport | StdioServerParameters = streamable_http_client(
                config.url, http_client=http
            )
        else:
            server = StdioServerParameters(
                command=config.command[0], args=config.command[1:], env=config.env or None
            )
        yield await stack.enter_async_context(Client(server, read_timeout_seconds=config.timeout))


def _lost(exc: Exception) -> bool:
    """Whether a call failed because the session is gone (not a timeout, not the server's
    answer): the SDK fails every call of a closed session with CONNECTION_CLOSED."""
    if isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError):
        return True
    return isinstance(exc, MCPError) and exc.error.code == types.CONNECTION_CLOSED


def _spec(tool: types.Tool) -> ToolSpec:
    return ToolSpec(tool.name, tool.description or "", tool.input_schema)


def to_tool_result(result: types.CallToolResult) -> ToolResult:
    """The text the model reads; non-text content is named, not inlined."""
    parts = [
        block.text if isinstance(block, types.TextContent) else f"[{block.type} content]"
        for block in result.content
    ]
    error = None
    if result.is_error:
        # Our own server says which failure it was; any other server just "failed".
        error = (result.meta or {}).get(ERROR_META_KEY) or "tool_error"
    return ToolResult("\n".join(parts), error=error)


class ToolRouter:
    """The manager: every tool by name, local or remote, and one `call` for them all."""

    def __init__(
        self, tools: Sequence[Tool] = (), connections: Sequence[MCPConnection] = ()
    ) -> None:
        self._owned: list[Tool | MCPConnection] = [*tools, *connections]
        self._tools: dict[str, Tool] = {}
        sources = [("local", tools), *((f"MCP server '{c.name}'", c.tools) for c in connections)]
        source_of: dict[str, str] = {}
        for source, source_tools in sources:
            for tool in source_tools:
                name = tool.spec.name
                if name in self._tools:
                    raise UserError(
                        f"two tools are named '{name}' ({source_of[name]}, {source})",
                        "a call names its tool, so each name must be unique: drop one source",
                    )
                self._tools[name], source_of[name] = tool, source

    @classmethod
    def connect(cls, tools: Sequence[Tool], servers: Sequence[MCPServerConfig]) -> ToolRouter:
        """Connect to every server; if one fails, close those already open, then raise."""
        connections: list[MCPConnection] = []
        try:
            for server in servers:
                connections.append(connect(server))
            return cls(tools, connections)
        except BaseException:
            for connection in connections:
                connection.close()
            raise

    def specs(self) -> list[ToolSpec]:
        return [tool.spec for tool in self._tools.values()]

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return ToolResult(f"no tool named '{name}'; available: {known}", error="unknown_tool")
        return call_safely(tool, arguments)

    def close(self) -> None:
        for owned in self._owned:
            owned.close()
