"""A pool of expert models that a policy consults, up to K at a time (EAPO).

Expert ids run 1..K and map onto endpoints by the pool's assignment. An endpoint is either
an OpenAI-compatible server (base URL) or a local model reference loaded in-process; both
kinds are created lazily and shared by every expert that maps to them.

`ask` sends a batch of (expert id, prompt[, reference]) calls concurrently and always returns one
`CallRecord` per call, in order: a failed, timed-out or unroutable call is recorded as
"unavailable" with the reason, never raised, because a rollout must go on when an expert
is down (the policy then sees that the expert could not answer).

Local engines are synchronous and hold one model, so the calls of one `ask` that go to
the same local model are sent as one batched `generate`, on a worker thread, under a
per-model lock (torch generation must not run twice at once on one model). Calls whose
params differ only in token budget and seed share that batch: they are grouped by
`SamplingParams.batch_key` and the group's params merged (`SamplingParams.merge`), so
each prompt of the batch keeps its own budget and seed.

The endpoint `reference` is the stand-in collaborator (`engines/reference.py`): the pool
answers it itself, from the reference a call carries, counting tokens with the pool's
tokenizer. It is never resolved as a model or a URL, and never cached (it costs nothing).

This module routes, batches and runs calls and owns the engines' lifetimes; what a call
and its record are (`engines/calls.py`), which endpoint serves an expert
(`engines/endpoints.py`), which failures to retry (`engines/retry.py`) and the disk
cache (`engines/response_cache.py`) live beside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from collabrl.config import EndpointConfig, EngineConfig, PoolConfig
from collabrl.engines import create_engine, is_url, resolve_kind
from collabrl.engines.base import Completion, Engine, Prompt, SamplingParams
from collabrl.engines.calls import UNKNOWN_EXPERT, Call, CallRecord, call_record
from collabrl.engines.endpoints import (
    check_pool_config,
    endpoint_index,
    endpoint_name,
    engine_key,
    resolve_endpoints,
)
from collabrl.engines.loop import LoopThread
from collabrl.engines.openai_http import OpenAIEngine, prompt_kind
from collabrl.engines.reference import (
    Reference,
    reference_completion,
    stand_in_accuracy,
    stand_in_continues,
    stand_in_teaches,
)
from collabrl.engines.response_cache import ResponseCache, cacheable
from collabrl.engines.retry import describe, is_transient

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

T = TypeVar("T")


NO_REFERENCE = "the reference stand-in needs the item's reference answer"
# The stand-in counts tokens in this tokenizer when the pool is given none.
DEFAULT_TOKENIZER = "smollm2-135m"

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# The pool
# ---------------------------------------------------------------------------------------------


class ExpertPool:
    """K experts over a list of endpoints; see the module docstring."""

    def __init__(
        self,
        config: PoolConfig,
        engine: EngineConfig | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        """`tokenizer` counts the `reference` stand-in's tokens (the policy's, so a call
        for n tokens gets n policy tokens); without one, the embedded default's is loaded
        at the stand-in's first call."""
        check_pool_config(config)
        self.config = config
        self._tokenizer = tokenizer
        # How every endpoint's engine is built, its chat-template options included (a
        # protocol's collaborators get the protocol's: protocols/collaborators.py).
        self.engine_config = engine or EngineConfig()
        self.endpoints = resolve_endpoints(config)
        self.cache = ResponseCache(config.cache_dir) if config.cache_dir else None
        self.generate_calls = 0  # engine calls made (one per local batch or HTTP request)
        self._lock = threading.Lock()  # guards the dicts below, the counter and _closed
        self._engines: dict[tuple, Engine] = {}
        self._creating: dict[tuple, threading.Lock] = {}
        self._generating: dict[tuple, threading.Lock] = {}
        # Our own threads rather than the loop's default executor: `asyncio.run` joins the
        # default executor on exit, so a still-running timed-out generate would block it.
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="collabrl-pool")
        self._runner: LoopThread | None = None
        self._closed = False

    # -- routing ------------------------------------------------------------------------------

    def endpoint_for(self, expert_id: int) -> EndpointConfig | None:
        """The endpoint serving `expert_id`, or None when the id is not in 1..K."""
        index = endpoint_index(expert_id, self.config.num_experts, len(self.endpoints))
        return None if index is None else self.endpoints[index]

    # -- asking -------------------------------------------------------------------------------

    async def ask(self, calls: list[Call], params: SamplingParams) -> list[CallRecord]:
        """Send every call concurrently; one record per call, in order, nothing raised.

        A call is a `Call` or a plain (expert id, prompt) tuple. As in one engine batch,
        call i is sampled with its own seed (`params.prompt_seed(i)`): a server seeds each
        request on its own, and a shared seed would make equal prompts answer alike.
        The same goes for its token budget (`params.prompt_budget(i)`).
        Raises only for misuse: a closed pool, or `params.n != 1` (a call has one answer).
        """
        params.check_seeds(len(calls))
        params.check_budgets(len(calls))
        own = [params.for_prompt(i) for i in range(len(calls))]
        return await self._ask_each([Call(*c) for c in calls], own)

    async def _ask_each(self, calls: list[Call], params: list[SamplingParams]) -> list[CallRecord]:
        """`ask` with each call's own sampling parameters (those of a one-prompt batch)."""
        self._check_open()
        for p in params:
            if p.n != 1:
                raise ValueError(f"an expert call has one answer: params.n must be 1, got {p.n}")
            p.check_seeds(1)
            p.check_budgets(1)
        # Each call's own seed and budget as `seed` and `max_tokens`: what its cache key
        # and the reference stand-in read.
        params = [p.for_prompt(0) for p in params]
        records: list[CallRecord | None] = [None] * len(calls)
        remote: list[int] = []
        # Local calls share a batch when only their token budgets and seeds differ.
        local: dict[tuple[str, Hashable], list[int]] = {}
        for i, (expert_id, prompt, reference) in enumerate(calls):
            records[i] = self._settle_early(expert_id, prompt, reference, params[i])
            if records[i] is not None:
                continue
            endpoint = self.endpoint_for(expert_id)
            assert endpoint is not None  # _settle_early records unknown ids
            if is_url(endpoint.ref):
                remote.append(i)
            else:
                local.setdefault((endpoint.ref, params[i].batch_key()), []).append(i)
        jobs = [self._ask_remote(i, calls[i], params[i]) for i in remote]
        jobs += [
            self._ask_local(
                [(i, calls[i]) for i in g], SamplingParams.merge([params[i] for i in g])
            )
            for g in local.values()
        ]
        for done in await asyncio.gather(*jobs):
            for i, record in done:
                records[i] = record
                self._remember(record, params[i])
        answered = [r for r in records if r is not None]
        assert len(answered) == len(calls), "every call gets exactly one record"
        return answered

    def ask_sync(self, calls: list[Call], params: SamplingParams) -> list[CallRecord]:
        """Blocking `ask`, usable from plain code and from inside a running event loop."""
        return self._run_sync(self.ask(calls, params))

    def ask_each_sync(self, calls: list[Call], params: list[SamplingParams]) -> list[CallRecord]:
        """Blocking `ask` with each call's own sampling params, all in flight at once: a
        relay round's teacher calls each ask for their own n, with their episode's seed.
        Local calls that differ only in budget and seed still share one batch."""
        if len(params) != len(calls):
            raise ValueError(f"one params per call: {len(params)} for {len(calls)} calls")
        return self._run_sync(self._ask_each([Call(*c) for c in calls], params))

    def _run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            runner = self._get_runner()
        except BaseException:
            coro.close()  # never awaited: close it rather than leak a warning
            raise
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: the usual case
            running = None
        if running is runner.loop:
            coro.close()
            raise RuntimeError("ask_sync would deadlock on the pool's own loop; await ask")
        return runner.submit(coro)

    def _settle_early(
        self,
        expert_id: int,
        prompt: Prompt,
        reference: Reference | None,
        params: SamplingParams,
    ) -> CallRecord | None:
        """The record of a call that needs no engine: unroutable, malformed, for the
        reference stand-in, or cached."""
        endpoint = self.endpoint_for(expert_id)
        if endpoint is None:
            return CallRecord(expert_id, "", prompt, None, "unavailable", UNKNOWN_EXPERT)
        name = endpoint_name(endpoint)
        try:
            prompt_kind(prompt)
        except ValueError as err:  # checked per call: one bad prompt must not sink a batch
            reason = f"invalid prompt: {err}"
            return CallRecord(expert_id, name, prompt, None, "unavailable", reason)
        accuracy = stand_in_accuracy(endpoint.ref)
        if accuracy is not None:
            written = self._partial_answer(prompt) if stand_in_continues(endpoint.ref) else None
            teaches = stand_in_teaches(endpoint.ref)
            return self._ask_reference(
                expert_id, name, prompt, reference, params, accuracy, written, teaches
            )
        entry = self._cached(endpoint, prompt, params)
        if entry is None:
            return None
        return CallRecord(
            expert_id,
            name,
            prompt,
            entry["text"],
            "cached",
            prompt_tokens=int(entry.get("prompt_tokens", 0)),
            completion_tokens=int(entry.get("completion_tokens", 0)),
            finish_reason=entry.get("finish_reason"),
        )

    def _ask_reference(
        self,
        expert_id: int,
        name: str,
        prompt: Prompt,
        reference: Reference | None,
        params: SamplingParams,
        accuracy: float,
        written: str | None,
        teaches: bool,
    ) -> CallRecord:
        """The stand-in's answer (continuing `written` unless None; its misses worked
        solutions too when it `teaches`), or "unavailable" for a call that brought no
        reference."""
        if reference is None:
            return CallRecord(expert_id, name, prompt, None, "unavailable", NO_REFERENCE)
        started = time.perf_counter()
        tokenizer = self._reference_tokenizer()
        completion = reference_completion(
            reference, params.max_tokens, tokenizer, accuracy, written, teaches
        )
        return CallRecord(
            expert_id,
            name,
            prompt,
            completion.text,
            "ok",
            latency_s=time.perf_counter() - started,
            completion_tokens=completion.completion_tokens,
            finish_reason=completion.finish_reason,
        )

    def _partial_answer(self, prompt: Prompt) -> str:
        """The answer a continuing stand-in is asked to go on with: a chat prompt's closing
        assistant message (the relay teacher's partial reply, `protocols/relay.py`), or
        none; a text or token prompt ends with it, so its whole text is searched."""
        if isinstance(prompt, str):
            return prompt
        if prompt and isinstance(prompt[0], int):
            return self._reference_tokenizer().decode(prompt, skip_special_tokens=True)
        last = prompt[-1] if prompt else None
        return (
            str(last["content"]) if isinstance(last, dict) and last["role"] == "assistant" else ""
        )

    def _reference_tokenizer(self) -> PreTrainedTokenizerBase:
        with self._lock:
            if self._tokenizer is None:
                from collabrl.models import load_tokenizer

                self._tokenizer = load_tokenizer(DEFAULT_TOKENIZER)
            return self._tokenizer

    async def _ask_remote(
        self, index: int, call: Call, params: SamplingParams
    ) -> list[tuple[int, CallRecord]]:
        expert_id, prompt = call.expert_id, call.prompt
        endpoint = self.endpoint_for(expert_id)
        assert endpoint is not None
        started = time.perf_counter()

        async def attempt() -> Completion:
            engine = self._engine(endpoint)  # an HTTP client: cheap to build on the loop
            assert isinstance(engine, OpenAIEngine)
            self._count_call()
            [[completion]] = await engine.agenerate([prompt], params)
            return completion

        completion, error, attempts = await self._with_retries(attempt, local=False)
        record = call_record(expert_id, endpoint, prompt, completion, error, attempts, started)
        return [(index, record)]

    async def _ask_local(
        self, items: list[tuple[int, Call]], params: SamplingParams
    ) -> list[tuple[int, CallRecord]]:
        """All calls to one local model as one batched generate; `params` are the batch's,
        with each call's own seed and budget."""
        endpoint = self.endpoint_for(items[0][1].expert_id)
        assert endpoint is not None
        prompts = [call.prompt for _, call in items]
        started = time.perf_counter()
        outputs: list[list[Completion]] | None = None
        try:
            # Loading runs outside the per-attempt timeout: a big model may take longer to
            # load than a call may take, and it is loaded once.
            engine = await self._in_thread(self._engine, endpoint)
        except Exception as exc:
            error, attempts = describe(exc, self.config.timeout), 1
        else:
            lock = self._generate_lock(endpoint)

            def attempt() -> Awaitable[list[list[Completion]]]:
                return self._in_thread(self._generate_locked, engine, lock, prompts, params)

            outputs, error, attempts = await self._with_retries(attempt, local=True)
        return [
            (
                i,
                call_record(
                    call.expert_id,
                    endpoint,
                    call.prompt,
                    outputs[j][0] if outputs else None,
                    error,
                    attempts,
                    started,
                ),
            )
            for j, (i, call) in enumerate(items)
        ]

    async def _with_retries(
        self, attempt: Callable[[], Awaitable[T]], local: bool
    ) -> tuple[T | None, str | None, int]:
        """Run `attempt` under the per-attempt timeout, retrying transient failures.

        Returns (result, None, attempts) or (None, reason, attempts); never raises,
        except for cancellation of the caller, which must propagate.
        """
        delay = self.config.backoff
        attempts = 0
        while True:
            attempts += 1
            try:
                return await asyncio.wait_for(attempt(), self.config.timeout), None, attempts
            except Exception as exc:
                if attempts > self.config.retries or not is_transient(exc, local):
                    return None, describe(exc, self.config.timeout), attempts
            await asyncio.sleep(delay)
            delay *= 2

    def _generate_locked(
        self,
        engine: Engine,
        lock: threading.Lock,
        prompts: list[Prompt],
        params: SamplingParams,
    ) -> list[list[Completion]]:
        with lock:
            self._count_call()
            return engine.generate(prompts, params)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    # -- cache --------------------------------------------------------------------------------

    def _cache_key(self, endpoint: EndpointConfig, prompt: Prompt, params: SamplingParams) -> str:
        # Both the name and the address: every EAPO expert server is named "expert".
        model: dict[str, Any] = {
            "ref": endpoint.ref,
            "served_model": endpoint.served_model if is_url(endpoint.ref) else None,
        }
        options = self.engine_config.chat_template_kwargs
        if options:  # another rendering of the prompt, another answer
            model["chat_template_kwargs"] = options
        return ResponseCache.key(model, prompt, params)

    def _cached(
        self, endpoint: EndpointConfig, prompt: Prompt, params: SamplingParams
    ) -> dict[str, Any] | None:
        if self.cache is None or not cacheable(params):
            return None
        return self.cache.get(self._cache_key(endpoint, prompt, params))

    def _remember(self, record: CallRecord, params: SamplingParams) -> None:
        if self.cache is None or record.outcome != "ok" or not cacheable(params):
            return
        endpoint = self.endpoint_for(record.expert_id)
        assert endpoint is not None and record.text is not None
        self.cache.put(
            self._cache_key(endpoint, record.prompt, params),
            {
                "text": record.text,
                "prompt_tokens": record.prompt_tokens,
                "completion_tokens": record.completion_tokens,
                "finish_reason": record.finish_reason,
            },
        )

    # -- engines ------------------------------------------------------------------------------

    def _engine(self, endpoint: EndpointConfig) -> Engine:
        """The shared engine of an endpoint, built on first use (once, even when raced)."""
        key = engine_key(endpoint)
        with self._lock:
            self._check_open_locked()
            engine = self._engines.get(key)
            if engine is not None:
                return engine
            creating = self._creating.setdefault(key, threading.Lock())
        with creating:
            with self._lock:
                engine = self._engines.get(key)
            if engine is not None:
                return engine
            engine = self._create_engine(endpoint)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._engines[key] = engine
            if closed:  # the pool closed while the model loaded
                engine.close()
                raise RuntimeError("the expert pool is closed")
            return engine

    def _create_engine(self, endpoint: EndpointConfig) -> Engine:
        base = self.engine_config
        if is_url(endpoint.ref):
            # max_retries=0: the pool retries itself, with a timeout per attempt; client
            # retries on top would multiply the time a dead endpoint can hold a call. The
            # client's timeout is only a backstop: the pool's per-attempt timeout fires first.
            config = dataclasses.replace(
                base,
                kind="openai",
                api_key=endpoint.api_key or base.api_key,
                served_model=endpoint.served_model or base.served_model,
                timeout=self.config.timeout + 1.0,
                max_retries=0,
            )
        else:
            kind = resolve_kind(endpoint.ref, base, collaborator=True)
            config = dataclasses.replace(base, kind=kind)
        return create_engine(endpoint.ref, config)

    def _generate_lock(self, endpoint: EndpointConfig) -> threading.Lock:
        with self._lock:
            return self._generating.setdefault(engine_key(endpoint), threading.Lock())

    def _count_call(self) -> None:
        with self._lock:
            self.generate_calls += 1

    # -- lifecycle ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        with self._lock:
            self._check_open_locked()

    def _check_open_locked(self) -> None:
        if self._closed:
            raise RuntimeError("the expert pool is closed")

    def _get_runner(self) -> LoopThread:
        with self._lock:
            self._check_open_locked()
            if self._runner is None:
                self._runner = LoopThread("collabrl-pool")
            return self._runner

    def close(self) -> None:
        """Close every engine and stop the pool's threads. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            engines = list(self._engines.values())
            self._engines.clear()
            runner, self._runner = self._runner, None
        for engine in engines:
            try:
                engine.close()
            except Exception as err:  # one stuck engine must not keep the others open
                log.warning("closing %s failed: %s", getattr(engine, "name", engine), err)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if runner is not None:
            runner.stop()

    def __enter__(self) -> ExpertPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        names = ", ".join(endpoint_name(e) for e in self.endpoints)
        return f"ExpertPool(K={self.config.num_experts}, {self.config.assignment}: {names})"


__all__ = ["ExpertPool"]
