"""Dynamic batching: requests that arrive together share one `generate` call.

The first request of a batch waits up to `wait_s` for others; requests with
identical sampling parameters are merged (a batch holds at most
`max_batch_size` sequences); generation runs on one worker thread, so the
event loop keeps accepting requests while the model works — and those
requests form the next batch.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from collabrl.engines.base import Completion, Engine, Prompt, SamplingParams


@dataclass
class _Job:
    prompts: list[Prompt]
    params: SamplingParams
    future: asyncio.Future = field(repr=False)

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
        # One thread: torch generation is not meant to run twice at once on one model.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self._task: asyncio.Task | None = None
        self.batches = 0  # generate calls made, for tests and logs

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._worker.shutdown(wait=True, cancel_futures=True)

    async def submit(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        job = _Job(prompts, params, asyncio.get_running_loop().create_future())
        await self._queue.put(job)
        return await job.future

    async def _loop(self) -> None:
        pending: list[_Job] = []
        while True:
            if not pending:
                pending.append(await self._queue.get())
            await self._collect(pending)
            batch, pending = _take_batch(pending, self.max_batch_size)
            await self._run(batch)

    async def _collect(self, pending: list[_Job]) -> None:
        """Wait up to `wait_s` for more requests, or until a batch is full."""
        deadline = time.monotonic() + self.wait_s
        while sum(j.rows for j in pending) < self.max_batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                pending.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break

    async def _run(self, batch: list[_Job]) -> None:
        prompts = [p for job in batch for p in job.prompts]
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(
                self._worker, self.engine.generate, prompts, batch[0].params
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


def _take_batch(pending: list[_Job], max_rows: int) -> tuple[list[_Job], list[_Job]]:
    """The oldest job plus later jobs with the same parameters, up to `max_rows` sequences."""
    first = pending[0]
    batch, rest, rows = [first], [], first.rows
    for job in pending[1:]:
        if job.params == first.params and rows + job.rows <= max_rows:
            batch.append(job)
            rows += job.rows
        else:
            rest.append(job)
    return batch, rest
