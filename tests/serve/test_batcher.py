"""Dynamic batching merges concurrent requests into one generate call."""

from __future__ import annotations

import asyncio
import time

import pytest

from collabrl.engines.base import SamplingParams
from collabrl.engines.hf import TransformersEngine
from collabrl.serve.batcher import DynamicBatcher, ShuttingDown


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


def test_requests_arriving_one_after_another_join_the_same_batch(tiny_engine):
    """The window restarts at each arrival: four requests 60 ms apart, with a 100 ms
    window, are one batch although the last comes 180 ms after the first."""
    params = SamplingParams(max_tokens=2)

    async def submit_later(batcher, delay):
        await asyncio.sleep(delay)
        return await batcher.submit(["q"], params)

    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=8, wait_s=0.1)
        batcher.start()
        await asyncio.gather(*(submit_later(batcher, 0.06 * i) for i in range(4)))
        await batcher.stop()
        return batcher.batches

    assert _run(main()) == 1


def test_different_parameters_are_not_mixed(tiny_engine):
    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=8, wait_s=0.2)
        batcher.start()
        await asyncio.gather(
            batcher.submit(["a"], SamplingParams(max_tokens=2)),
            batcher.submit(["a"], SamplingParams(max_tokens=2, temperature=1.0, seed=0)),
        )
        await batcher.stop()
        return batcher.batches

    assert _run(main()) == 2


def test_requests_that_differ_in_max_tokens_share_a_batch_each_with_its_budget(tiny_engine):
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
    alone = tiny_engine.generate(["a"], SamplingParams(max_tokens=6))[0][0]
    assert batches == 1
    assert short[0][0].token_ids == alone.token_ids[:2]
    assert long[0][0].token_ids == alone.token_ids


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


def test_a_cancelled_request_is_dropped_before_it_is_generated(tiny_engine):
    """A client that goes away cancels its request: the queue skips it."""

    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=1, wait_s=0.0)
        batcher.start()
        busy = asyncio.ensure_future(batcher.submit(["busy"], SamplingParams(max_tokens=200)))
        await asyncio.sleep(0.1)  # generating
        # Distinct seeds: each would be a generate call of its own.
        gone = [
            asyncio.ensure_future(batcher.submit(["x"], SamplingParams(max_tokens=200, seed=i)))
            for i in range(5)
        ]
        await asyncio.sleep(0)  # queued behind the busy one
        for request in gone:
            request.cancel()
        await busy
        await batcher.submit(["y"], SamplingParams(max_tokens=2))
        await batcher.stop()
        return batcher.batches, batcher.dropped

    assert _run(main()) == (2, 5)


def test_stop_answers_every_open_request_at_once(tiny_engine):
    """One generating and two queued, about 30 s of work: all fail at once on a stop."""
    engine = TransformersEngine(tiny_engine.model, tiny_engine.tokenizer)

    async def main():
        batcher = DynamicBatcher(engine, max_batch_size=1, wait_s=0.0)
        batcher.start()
        requests = [
            asyncio.ensure_future(
                batcher.submit(["Hello"], SamplingParams(max_tokens=2000, seed=i))
            )
            for i in range(3)
        ]
        await asyncio.sleep(0.3)
        began = time.monotonic()
        await batcher.stop()
        results = await asyncio.gather(*requests, return_exceptions=True)
        late = await asyncio.gather(batcher.submit(["z"], SamplingParams()), return_exceptions=True)
        return time.monotonic() - began, results, late

    elapsed, results, late = _run(main())
    assert elapsed < 2
    assert all(isinstance(r, ShuttingDown) for r in [*results, *late])


def test_streamed_rows_reach_their_own_job_in_a_merged_batch(tiny_engine):
    """Two requests of two samples each share one generate call; each is told its own rows'
    tokens as they grow, ending with the tokens of its answer."""
    params = SamplingParams(max_tokens=5, temperature=1.0, n=2, seed=1)

    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=8, wait_s=0.2)
        batcher.start()
        seen: list[dict[int, list[list[int]]]] = [{}, {}]

        def tell(job: int):
            return lambda row, tokens: seen[job].setdefault(row, []).append(tokens)

        answers = await asyncio.gather(
            batcher.submit(["Once"], params, tell(0)), batcher.submit(["The cat"], params, tell(1))
        )
        await batcher.stop()
        return batcher.batches, seen, answers

    batches, seen, answers = _run(main())
    assert batches == 1
    for told, [samples] in zip(seen, answers, strict=True):
        assert sorted(told) == [0, 1]
        for row, completion in enumerate(samples):
            grown = told[row]
            assert [len(t) for t in grown] == list(range(1, len(grown) + 1))  # token by token
            assert grown[-1][: len(completion.token_ids)] == completion.token_ids


def test_a_generation_nobody_waits_for_stops_at_its_next_token(tiny_engine):
    """A client that leaves mid-generation (a closed stream) frees the model at once, not
    after the 1900 tokens it asked for (about 4 s)."""

    async def main():
        batcher = DynamicBatcher(tiny_engine, wait_s=0.01)
        batcher.start()
        generating = asyncio.Event()
        job = asyncio.ensure_future(
            batcher.submit(["Hello"], SamplingParams(max_tokens=1900), lambda *_: generating.set())
        )
        await generating.wait()
        job.cancel()
        began = time.monotonic()
        await batcher.submit(["x"], SamplingParams(max_tokens=1))
        waited = time.monotonic() - began
        await batcher.stop()
        return waited

    assert _run(main()) < 1.0


def test_a_call_runs_on_the_generation_thread_between_batches(tiny_engine):
    """Scoring uses the model too: on the one generation thread it waits for the batch in
    progress, never runs beside it."""
    import threading

    params = SamplingParams(max_tokens=24)

    def score_on(thread: list[str], ids: list[int]):
        thread.append(threading.current_thread().name)
        return tiny_engine.score(ids, 2)

    async def main():
        batcher = DynamicBatcher(tiny_engine, max_batch_size=4, wait_s=0.01)
        batcher.start()
        generating = asyncio.ensure_future(batcher.submit(["Once upon a time"], params))
        while batcher.running == 0:  # the batch is on the generation thread
            await asyncio.sleep(0.001)
        queued = asyncio.ensure_future(batcher.submit(["q"], params))
        await asyncio.sleep(0.05)
        waiting = batcher.waiting
        thread: list[str] = []
        scores = await batcher.call(score_on, thread, tiny_engine.encode("Hello there"))
        await asyncio.gather(generating, queued)
        await batcher.stop()
        with pytest.raises(ShuttingDown):
            await batcher.call(len, [])
        return waiting, scores, thread, (batcher.running, batcher.waiting)

    waiting, scores, thread, after = _run(main())
    assert waiting == 1 and after == (0, 0)
    assert len(scores) == 1 and len(scores[0].top) == 2
    assert thread[0].startswith("generate")
