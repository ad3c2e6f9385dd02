"""`collab serve tools`: the Python tool over MCP, from the real CLI, over HTTP and stdio."""

from __future__ import annotations

import sys

from collabrl.tools.mcp_client import connect, parse_server
from tests.servers import ServerProcess


def _sum_of_squares(connection) -> str:
    result = connection.call_tool("python", {"code": "print(sum(i * i for i in range(5)))"})
    assert result.ok, result.text
    return result.text


def test_serve_tools_over_http() -> None:
    with ServerProcess("unused", role="tools", extra=("--tool", "python")) as server:
        url = f"http://127.0.0.1:{server.port}/mcp"
        connection = connect(parse_server(url))
        try:
            assert [t.spec.name for t in connection.tools] == ["python"]
            assert _sum_of_squares(connection) == "30"
        finally:
            connection.close()


def test_serve_tools_over_stdio() -> None:
    command = f"stdio:{sys.executable} -m collabrl.cli.main serve tools --transport stdio"
    connection = connect(parse_server(command + " --tool python"))
    try:
        assert _sum_of_squares(connection) == "30"
    finally:
        connection.close()
