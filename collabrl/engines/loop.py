"""An asyncio event loop on its own daemon thread, for sync callers of async code.

An async HTTP client's connection pool is bound to the loop it first ran on, so
engines that serve sync callers run all their coroutines on one such loop
instead of a fresh `asyncio.run` per call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running forever in a daemon thread."""

    def __init__(self, name: str = "collabrl-loop") -> None:
        self.loop = asyncio.new_event_loop()
        # Daemon: a forgotten `close()` must not keep the interpreter alive at exit.
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and block this thread until it finishes."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
