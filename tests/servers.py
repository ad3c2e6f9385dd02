"""Start the real embedded server (`collab serve`) in a subprocess for tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`collab serve ROLE --engine ENGINE` on 127.0.0.1, stopped on exit.

    It is ready when a line of its output contains `ready` (default `ready:`, the
    embedded server's `ready: URL`; vLLM's server logs `Application startup complete`).
    """

    def __init__(
        self,
        model: str | Path,
        port: int | None = None,
        role: str = "expert",
        api_key: str | None = None,
        extra: tuple[str, ...] = (),
        engine: str = "transformers",
        ready: str = "ready:",
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        cmd = [
            sys.executable,
            "-m",
            "collabrl.cli.main",
            "serve",
            role,
            "--model",
            str(model),
            "--engine",
            engine,
            "--port",
            str(self.port),
            *extra,
        ]
        if api_key:
            cmd += ["--api-key", api_key]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._ready_marker = ready
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if self._ready_marker in line:
                self._ready.set()

    def wait_ready(self, timeout: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("server did not start:\n" + "".join(self.lines))
        return self

    def kill(self) -> None:
        """SIGTERM first: `collab serve --engine vllm` forwards it to the vLLM server it
        started in a process group of its own, which a SIGKILL would leave running."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait(timeout=30)

    def __enter__(self) -> ServerProcess:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.kill()
