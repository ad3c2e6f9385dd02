"""Tests for collabrl.engines.endpoints' checks of a collaborator before any work: real
servers that are down, that are not OpenAI-compatible, and that are."""

from __future__ import annotations

import functools
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from collabrl.engines.endpoints import check_collaborator, check_reachable
from collabrl.errors import UserError


@pytest.fixture
def plain_http_server(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server that is not an OpenAI-compatible one (it serves files)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_that_is_down_is_one_error() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(UserError, match=f"cannot reach {url}"):
        check_reachable(url, None)


def test_a_server_that_is_not_openai_compatible_is_one_error(plain_http_server: str) -> None:
    with pytest.raises(UserError, match="/models was not found"):
        check_reachable(plain_http_server, None)


def test_the_reference_stand_in_and_local_models_are_checked_without_a_request(
    tiny_model_dir: Path,
) -> None:
    check_collaborator("reference", None)
    check_collaborator(str(tiny_model_dir), None)
    with pytest.raises(UserError, match="unknown model"):
        check_collaborator("no-such-model", None)


class _Garbage(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 200 and bytes that are neither UTF-8 nor JSON."""

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = b"\xff\xfe\x00garbage<html>"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_answering_garbage_bytes_is_one_error() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        with pytest.raises(UserError, match="not an OpenAI-compatible response"):
            check_reachable(url, None)
    finally:
        server.shutdown()
        server.server_close()
