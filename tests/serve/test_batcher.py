"""Dynamic batching merges concurrent requests into one generate call."""

from __future__ import annotations

import asyncio

from collabrl.engines.base import SamplingParams
from collabrl.serve.batcher import DynamicBatcher


def _run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_one_generate_call(tiny_engine):
    params = SamplingParams(max_tokens=4)

    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=8, wait_s=0.2)
        batcher.start()
        results = await asyncio.gather(*(batcher.submit([f"q{i}"], params) for i in range(4)))
        await batcher.stop()
        return batcher.batches, results

    batches, results = _run(main())
    assert batches == 1
    alone = tiny_engine.generate(["q2"], params)
    assert results[2][0][0].token_ids == alone[0][0].token_ids  # each request gets its own rows


def test_different_parameters_are_not_mixed(tiny_engine):
    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=8, wait_s=0.2)
        batcher.start()
        short, long = await asyncio.gather(
            batcher.submit(["a"], SamplingParams(max_tokens=2)),
            batcher.submit(["a"], SamplingParams(max_tokens=6)),
        )
        await batcher.stop()
        return batcher.batches, short, long

    batches, short, long = _run(main())
    assert batches == 2
    assert len(short[0][0].token_ids) <= 2
    assert len(long[0][0].token_ids) > 2 or long[0][0].finish_reason == "stop"


def test_batch_size_limit_splits_batches(tiny_engine):
    params = SamplingParams(max_tokens=2, n=2)

    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=4, wait_s=0.2)
        batcher.start()
        await asyncio.gather(*(batcher.submit(["x"], params) for _ in range(4)))  # 8 rows
        await batcher.stop()
        return batcher.batches

    assert _run(main()) == 2


def test_engine_failure_fails_requests_not_the_batcher(tiny_engine):
    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=4, wait_s=0.01)
        batcher.start()
        bad = await asyncio.gather(
            batcher.submit([[]], SamplingParams(max_tokens=2)), return_exceptions=True
        )
        good = await batcher.submit(["ok"], SamplingParams(max_tokens=2))
        await batcher.stop()
        return bad, good

    bad, good = _run(main())
    assert isinstance(bad[0], Exception)
    assert len(good[0]) == 1
