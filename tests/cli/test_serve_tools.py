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


def test_ctrl_c_stops_the_tools_server_like_the_model_server() -> None:
    """Ctrl-C is how a served tool stops: "stopped" and exit 0 (it was a silent 130)."""
    import signal
    import subprocess

    process = subprocess.Popen(
        [sys.executable, "-m", "collabrl.cli.main", "serve", "tools", "--transport", "stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT at its default, as under a terminal (a background test run ignores it).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stderr is not None
    assert process.stderr.readline().startswith("ready: stdio")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0
    assert stderr.splitlines() == ["stopped"]
