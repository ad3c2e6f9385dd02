"""Serve collabrl tools over MCP, so any MCP client can call them (AlphaApollo §2.1).

Each `Tool` becomes one MCP tool: its spec is listed as is (name, description, JSON
schema), and a call runs `tool.call` in a worker thread, because tool calls block
(a sandboxed Python run takes seconds) and the event loop must keep answering the
other calls of a batch meanwhile. A failed `ToolResult` comes back as a tool result
with `isError` set — the model reads it like any result, and clients count it.

    python -m collabrl.tools.mcp_server --transport stdio      # launched by a client
    python -m collabrl.tools.mcp_server --transport http --port 8931
"""

from __future__ import annotations

import argparse
import secrets
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from collabrl.errors import UserError
from collabrl.tools.base import Tool
from collabrl.tools.mcp_client import ERROR_META_KEY, ToolRouter

MCP_PATH = "/mcp"
# The largest HTTP request body served: a python call's code is capped at 64 KiB
# (`python.max_code_bytes`), which JSON's escapes can grow six-fold; anything far
# beyond is no tool call, and reading it would cost the server memory without bound.
MAX_REQUEST_BYTES = 1 << 20


def build_server(tools: Sequence[Tool], name: str = "collabrl-tools") -> Server:
    """A low-level MCP server listing `tools` and routing calls to them by name.

    The low-level server, not MCPServer (FastMCP), because it takes each tool's JSON
    schema as written; MCPServer derives schemas from Python signatures.
    """
    router = ToolRouter(tools)
    listing = types.ListToolsResult(
        tools=[
            types.Tool(name=t.spec.name, description=t.spec.description, input_schema=_schema(t))
            for t in tools
        ]
    )

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        result = await anyio.to_thread.run_sync(router.call, params.name, params.arguments or {})
        meta = {ERROR_META_KEY: result.error} if result.error else None
        return types.CallToolResult(
            content=[types.TextContent(text=result.text)], is_error=not result.ok, _meta=meta
        )

    return Server(name, on_list_tools=list_tools, on_call_tool=call_tool)


def _schema(tool: Tool) -> dict[str, Any]:
    # MCP requires an object schema at the root; a tool without parameters has none yet.
    return tool.spec.parameters or {"type": "object", "properties": {}}


def serve_tools(
    tools: Sequence[Tool],
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8931,
    api_key: str | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve `tools` until the client hangs up (stdio) or SIGINT/SIGTERM (http).

    Over HTTP, `api_key` (if set) is required as `Authorization: Bearer KEY`; a stdio
    server is reachable only by the process that launched it. `on_ready` gets the
    address once clients can connect: "stdio", or the URL of the HTTP endpoint.
    Over stdio, stdout carries the protocol, so `on_ready` must not print there.
    """
    server = build_server(tools)
    if transport == "stdio":
        anyio.run(_serve_stdio, server, on_ready)
    elif transport == "http":
        _serve_http(server, host, port, api_key, on_ready)
    else:
        raise UserError(f"unknown MCP transport '{transport}'", "use stdio or http")


async def _serve_stdio(server: Server, on_ready: Callable[[str], None] | None) -> None:
    async with stdio_server() as (read_stream, write_stream):
        if on_ready:
            on_ready("stdio")
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _serve_http(
    server: Server,
    host: str,
    port: int,
    api_key: str | None,
    on_ready: Callable[[str], None] | None,
) -> None:
    import uvicorn

    # Stateless: tools keep nothing between calls, and a stateful session would be
    # reaped while a training step leaves it idle for longer than its idle timeout.
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True, host=host)
    if api_key:
        app = _require_bearer(app, api_key)
    app = _limit_body(app, MAX_REQUEST_BYTES)
    # Bound here rather than by uvicorn, so the address is known (port 0 picks a free
    # one) and connections made right after `on_ready` wait in the backlog.
    try:
        sock = socket.create_server((host, port))
    except OSError as exc:
        raise UserError(
            f"could not listen on {host}:{port} ({exc.strerror})",
            "is the port in use? pick another with --port",
        ) from exc
    url = f"http://{host}:{sock.getsockname()[1]}{MCP_PATH}"
    if on_ready:
        on_ready(url)
    with sock:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def _require_bearer(app: ASGIApp, api_key: str) -> ASGIApp:
    """`app`, answering 401 to any HTTP request without `Authorization: Bearer KEY`.

    A plain check rather than the SDK's OAuth resource-server support: a shared key
    is what a training cluster's tool server needs, like `collab serve --api-key`.
    """
    expected = f"Bearer {api_key}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            sent = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(sent, expected):
                # A JSON-RPC error body, so MCP clients show its message, not just "401".
                error = {"code": types.INVALID_REQUEST, "message": "missing or wrong API key"}
                body = {"jsonrpc": "2.0", "id": None, "error": error}
                response = JSONResponse(body, status_code=401)
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


def _limit_body(app: ASGIApp, max_bytes: int) -> ASGIApp:
    """`app`, answering 413 to an HTTP request whose body is over `max_bytes`: by its
    Content-Length before reading, or, when it sends none (chunked), once the bytes
    read pass the cap."""

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > max_bytes:
            await _too_large(max_bytes)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > max_bytes:
                raise _TooLarge
            return message

        try:
            await app(scope, counted, send)
        except _TooLarge:
            await _too_large(max_bytes)(scope, receive, send)

    return limited


class _TooLarge(Exception):
    """A request body that passed the cap while being read."""


def _too_large(max_bytes: int) -> JSONResponse:
    error = {"code": types.INVALID_REQUEST, "message": f"request body over {max_bytes} bytes"}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=413)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m collabrl.tools.mcp_server`: how MCP clients launch our tools over stdio."""
    parser = argparse.ArgumentParser(description="Serve collabrl's tools over MCP.")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--api-key", help="http: require `Authorization: Bearer API_KEY`.")
    parser.add_argument("--tools", default="python,retrieve", help="Comma-separated tool names.")
    args = parser.parse_args(argv)
    # Imported here: the tools' own imports are heavy, and `build_server` needs none.
    from collabrl.tools.python import PythonToolConfig
    from collabrl.tools.retrieval import RetrievalConfig
    from collabrl.tools.toolset import build_tools

    try:
        tools = build_tools(args.tools.split(","), PythonToolConfig(), RetrievalConfig())
        try:
            serve_tools(
                tools, args.transport, args.host, args.port, args.api_key, on_ready=_announce
            )
        finally:
            for tool in tools:
                tool.close()
    except UserError as exc:
        sys.exit(f"error: {exc}")


def _announce(address: str) -> None:
    # stderr: over stdio, stdout is the protocol's channel.
    print(f"ready: {address}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
