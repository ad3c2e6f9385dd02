"""Dynamic batching: requests that arrive together share one `generate` call.

A batch takes requests until none has come for `wait_s`; requests whose sampling
parameters differ at most in their seed and `max_tokens` are merged, each prompt keeping
its request's seed and budget (a batch holds at most `max_batch_size` sequences);
generation runs on one worker thread, so the
event loop keeps accepting requests while the model works — and those
requests form the next batch.

A job whose future was cancelled (its client went away) is dropped before it is
generated, and a generation whose every job was cancelled stops at its next token.
`stop` fails every job not yet answered at once and interrupts the generation in
progress, so a busy server stops within seconds. A job may ask to be told its rows'
tokens as they are decoded (`on_tokens`, a streamed answer), from engines that can.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from collabrl.engines.base import (
    Completion,
    Engine,
    Interruptible,
    Prompt,
    SamplingParams,
    Streaming,
    TokenCallback,
)

T = TypeVar("T")


class ShuttingDown(Exception):
    """The batcher stopped before the job was answered."""


@dataclass
class _Job:
    prompts: list[Prompt]
    params: SamplingParams
    future: asyncio.Future = field(repr=False)
    on_tokens: TokenCallback | None = field(default=None, repr=False)  # on the event loop

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.params.n


class DynamicBatcher:
    """Collects concurrent requests into batched `engine.generate` calls."""

    def __init__(self, engine: Engine, max_batch_size: int = 16, wait_s: float = 0.01) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._pending: list[_Job] = []  # taken from the queue, not yet in a batch
        self._running: list[_Job] = []  # the batch being generated
        # One thread: torch generation is not meant to run twice at once on one model.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self._task: asyncio.Task | None = None
        self._stopping = threading.Event()  # set by `stop`: no job is taken any more
        # Set when nobody waits for the batch being generated (its clients left, or
        # `stop`): an interruptible engine's generate ends at its next token. One per batch.
        self._abandoned = threading.Event()
        self.batches = 0  # generate calls made, for tests and logs
        self.dropped = 0  # jobs skipped because their caller had gone

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Fail the jobs not yet answered with `ShuttingDown` and stop the generation in
        progress (for engines that can); idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        # Taken before the loop is cancelled: cancelling it forgets the running batch.
        unanswered = [*self._running, *self._pending]
        while not self._queue.empty():
            unanswered.append(self._queue.get_nowait())
        for job in unanswered:
            if not job.future.done():
                job.future.set_exception(ShuttingDown("the server is shutting down"))
        self._abandoned.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        # No waiting here: the event loop must go on answering, and an interrupted
        # generate returns within a token anyway.
        self._worker.shutdown(wait=False, cancel_futures=True)

    async def submit(
        self, prompts: list[Prompt], params: SamplingParams, on_tokens: TokenCallback | None = None
    ) -> list[list[Completion]]:
        """The completions of `prompts`; cancelling the caller drops the job if it is
        still queued, and stops its generation if no other job shares it. `on_tokens(row,
        tokens)` (row: prompt-major, `n` per prompt) is called on the event loop as each
        row grows, when the engine can tell (`Streaming`)."""
        if self._stopping.is_set():
            raise ShuttingDown("the server is shutting down")
        job = _Job(prompts, params, asyncio.get_running_loop().create_future(), on_tokens)
        self._queue.put_nowait(job)
        return await job.future  # cancelling this await cancels the job's future

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the generation thread, after the batch in progress (scoring a
        prompt uses the model too, which is not meant to run twice at once)."""
        if self._stopping.is_set():
            raise ShuttingDown("the server is shutting down")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        except asyncio.CancelledError:
            if self._stopping.is_set():  # `stop` cancelled it before it ran
                raise ShuttingDown("the server is shutting down") from None
            raise

    @property
    def waiting(self) -> int:
        """Requests queued, not yet generating."""
        return self._queue.qsize() + sum(not job.future.done() for job in self._pending)

    @property
    def running(self) -> int:
        """Requests in the batch being generated."""
        return sum(not job.future.done() for job in self._running)

    async def _loop(self) -> None:
        while True:
            if not self._pending:
                self._pending.append(await self._queue.get())
            await self._collect(self._pending)
            waiting = [job for job in self._pending if not job.future.done()]
            self.dropped += len(self._pending) - len(waiting)
            if not waiting:
                self._pending = []
                continue
            self._running, self._pending = _take_batch(waiting, self.max_batch_size)
            try:
                await self._run(self._running)
            finally:
                self._running = []

    async def _collect(self, pending: list[_Job]) -> None:
        """Take more requests until none has come for `wait_s`, or until a batch is full.

        The window restarts at each arrival: concurrent clients reach the queue a few
        milliseconds apart (each request is parsed and tokenized on the event loop
        first), and a fixed window split 8 concurrent requests into batches of 5 and 3.
        A batch still closes within `max_batch_size * wait_s`."""
        while sum(j.rows for j in pending) < self.max_batch_size:
            try:
                pending.append(await asyncio.wait_for(self._queue.get(), self.wait_s))
            except TimeoutError:
                break

    async def _run(self, batch: list[_Job]) -> None:
        prompts = [p for job in batch for p in job.prompts]
        loop = asyncio.get_running_loop()
        self._abandoned = abandoned = threading.Event()

        def on_done(_: asyncio.Future) -> None:
            if all(job.future.done() for job in batch):
                abandoned.set()

        for job in batch:
            job.future.add_done_callback(on_done)
        on_tokens = _token_router(batch, loop)
        try:
            outputs = await loop.run_in_executor(
                self._worker, self._generate, prompts, _batch_params(batch), on_tokens
            )
        except Exception as err:  # a failed batch fails its requests, not the server
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(err)
            return
        self.batches += 1
        start = 0
        for job in batch:
            if not job.future.done():  # the client may have gone away
                job.future.set_result(outputs[start : start + len(job.prompts)])
            start += len(job.prompts)

    def _generate(
        self, prompts: list[Prompt], params: SamplingParams, on_tokens: TokenCallback | None
    ) -> list[list[Completion]]:
        with contextlib.ExitStack() as scope:
            if isinstance(self.engine, Interruptible):
                scope.enter_context(self.engine.interruptible(self._abandoned))
            if on_tokens is not None and isinstance(self.engine, Streaming):
                scope.enter_context(self.engine.streaming(on_tokens))
            return self.engine.generate(prompts, params)


def _batch_params(batch: list[_Job]) -> SamplingParams:
    """The params of a merged batch: each prompt with its own request's seed and budget."""
    rows = [job.params.for_prompt(i) for job in batch for i in range(len(job.prompts))]
    return SamplingParams.merge(rows)


def _token_router(batch: list[_Job], loop: asyncio.AbstractEventLoop) -> TokenCallback | None:
    """The engine's token callback for a merged batch (called on the worker thread): each
    row's tokens go to its job's `on_tokens`, on the event loop, as the job's own row."""
    if all(job.on_tokens is None for job in batch):
        return None  # nobody streams: no per-token work
    starts = [0, *itertools.accumulate(job.rows for job in batch)][:-1]

    def route(row: int, tokens: list[int]) -> None:
        at = bisect.bisect_right(starts, row) - 1
        job = batch[at]
        if job.on_tokens is not None and not job.future.done():
            # A copy: the engine appends to `tokens` while the loop reads it.
            loop.call_soon_threadsafe(job.on_tokens, row - starts[at], list(tokens))

    return route


def _take_batch(pending: list[_Job], max_rows: int) -> tuple[list[_Job], list[_Job]]:
    """The oldest job plus later jobs whose parameters differ at most in their seed and
    token budget (`SamplingParams.batch_key`), up to `max_rows` sequences."""
    first = pending[0]
    shared = first.params.batch_key()
    batch, rest, rows = [first], [], first.rows
    for job in pending[1:]:
        if job.params.batch_key() == shared and rows + job.rows <= max_rows:
            batch.append(job)
            rows += job.rows
        else:
            rest.append(job)
    return batch, rest
