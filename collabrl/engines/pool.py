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
per-model lock (torch generation must not run twice at once on one model).

The endpoint `reference` is the stand-in collaborator (`engines/reference.py`): the pool
answers it itself, from the reference a call carries, counting tokens with the pool's
tokenizer. It is never resolved as a model or a URL, and never cached (it costs nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

import openai

from collabrl.config import EndpointConfig, EngineConfig, PoolConfig
from collabrl.engines import create_engine, is_url
from collabrl.engines.base import (
    BudgetedEngine,
    Completion,
    Engine,
    Prompt,
    SamplingParams,
    generate_by_budget,
)
from collabrl.engines.loop import LoopThread
from collabrl.engines.openai_http import OpenAIEngine, prompt_kind
from collabrl.engines.reference import REFERENCE, REFERENCE_NAME, Reference, reference_completion
from collabrl.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Outcome = Literal["ok", "unavailable", "cached"]
T = TypeVar("T")


class Call(NamedTuple):
    """One question to one expert; `reference` is what the `reference` stand-in answers
    from (the item's gold answer), ignored by every real endpoint."""

    expert_id: int
    prompt: Prompt
    reference: Reference | None = None


ASSIGNMENTS = ("round_robin", "per_expert")
UNKNOWN_EXPERT = "unknown expert id"
NO_REFERENCE = "the reference stand-in needs the item's reference answer"
# The stand-in counts tokens in this tokenizer when the pool is given none.
DEFAULT_TOKENIZER = "smollm2-135m"
# HTTP statuses worth another try: the server is busy or broke mid-request.
_TRANSIENT_STATUS = (408, 409, 429)

log = logging.getLogger(__name__)


@dataclass
class CallRecord:
    """What happened to one call to one expert."""

    expert_id: int
    endpoint: str  # display name of the endpoint (no API key)
    prompt: Prompt
    text: str | None
    outcome: Outcome
    error: str | None = None
    latency_s: float = 0.0  # wall time of the call, retries and backoff included
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0  # requests actually sent; 0 for cache hits and unroutable calls
    # "stop" (the model's EOS, or a stop string) or "length"; None when nothing came back.
    # RelayLLM ends the episode when the teacher's reply ends at its EOS.
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        """An answer is available, fresh or from the cache."""
        return self.outcome != "unavailable"


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def check_pool_config(config: PoolConfig) -> None:
    """Reject a pool that cannot work, before any engine is built."""
    if not config.endpoints:
        raise UserError("the expert pool has no endpoints", "pass --expert URL_OR_MODEL")
    if config.num_experts < 1:
        raise UserError(f"num_experts must be >= 1, got {config.num_experts}", "set K to 1..")
    if config.assignment not in ASSIGNMENTS:
        raise UserError(
            f"unknown expert assignment '{config.assignment}'", f"use {' or '.join(ASSIGNMENTS)}"
        )
    if config.assignment == "per_expert" and len(config.endpoints) != config.num_experts:
        raise UserError(
            f"per_expert assignment needs one endpoint per expert: {config.num_experts} "
            f"experts but {len(config.endpoints)} endpoints",
            f"pass exactly {config.num_experts} --expert options, or use round_robin",
        )
    if config.timeout <= 0:
        raise UserError(f"pool timeout must be > 0 seconds, got {config.timeout}")
    if config.retries < 0 or config.backoff < 0:
        raise UserError("pool retries and backoff must be >= 0")


def resolve_endpoints(config: PoolConfig) -> list[EndpointConfig]:
    """The pool's endpoints, each with the pool-wide served model and API key."""
    return [
        EndpointConfig(ref=ref, served_model=config.served_model, api_key=config.api_key)
        for ref in config.endpoints
    ]


def endpoint_index(expert_id: int, num_experts: int, num_endpoints: int) -> int | None:
    """Which endpoint serves an expert, or None for an id outside 1..K.

    Round robin and per-expert share the formula: with one endpoint per expert,
    `(i - 1) % K` is simply `i - 1`.
    """
    if isinstance(expert_id, bool) or not isinstance(expert_id, int):
        return None
    if not 1 <= expert_id <= num_experts:
        return None
    return (expert_id - 1) % num_endpoints


def endpoint_name(endpoint: EndpointConfig) -> str:
    if endpoint.ref == REFERENCE:
        return REFERENCE_NAME
    if is_url(endpoint.ref) and endpoint.served_model:
        return f"{endpoint.served_model}@{endpoint.ref}"
    return endpoint.ref


def _engine_key(endpoint: EndpointConfig) -> tuple[str | None, ...]:
    # A local model is one set of weights whatever name it is asked by; URL endpoints
    # differ by the model and key they send, so those are part of their identity.
    if is_url(endpoint.ref):
        return ("url", endpoint.ref, endpoint.served_model, endpoint.api_key)
    return ("local", endpoint.ref)


# ---------------------------------------------------------------------------------------------
# Errors and retries
# ---------------------------------------------------------------------------------------------


def is_transient(exc: BaseException, local: bool) -> bool:
    """Whether another attempt may succeed (a down or busy server) or is pointless."""
    if isinstance(exc, TimeoutError):
        # A local generate that timed out still runs and holds its model's lock: a retry
        # would only queue behind it. A remote server may have had a hiccup.
        return not local
    if isinstance(exc, UserError):
        if exc.__cause__ is None:
            return False  # our own diagnosis (bad model ref, no served model): final
        exc = exc.__cause__  # map_error keeps the openai exception as the cause
    if isinstance(exc, openai.APIConnectionError):  # includes the client's own timeout
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in _TRANSIENT_STATUS or exc.status_code >= 500
    if isinstance(exc, openai.OpenAIError | UserError | ValueError | TypeError):
        return False  # 401, 404, 400, a malformed prompt: the same request fails again
    return True  # e.g. a connection reset surfacing as OSError, a CUDA out-of-memory


def describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, UserError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------------------------
# Response cache
# ---------------------------------------------------------------------------------------------


def cacheable(params: SamplingParams) -> bool:
    """Only a deterministic request may be answered from the cache.

    An unseeded sample is meant to differ every time; replaying one would silently
    collapse an expert's diversity into its first answer.
    """
    return params.greedy or params.seed is not None


class ResponseCache:
    """Successful answers on disk, one JSON file per request: `folder/ab/<sha256>.json`."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @staticmethod
    def key(model: dict[str, Any], prompt: Prompt, params: SamplingParams) -> str:
        # params carries the seed, so a different seed is a different key.
        blob = json.dumps(
            {"model": model, "prompt": prompt, "params": dataclasses.asdict(params)},
            sort_keys=True,
            ensure_ascii=False,
        )
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def path(self, key: str) -> Path:
        # Two-character shards keep any one folder small with millions of entries.
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # missing or damaged: a miss, and the next success rewrites it
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
            return None
        return entry

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Write atomically (temp file + rename): readers never see half an entry."""
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        except OSError as err:
            log.warning("response cache: cannot write under %s: %s", path.parent, err)
            return
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, ensure_ascii=False)
            os.replace(tmp, path)
        except OSError as err:  # a full disk must not fail the call that was answered
            log.warning("response cache: cannot write %s: %s", path, err)
            with contextlib.suppress(OSError):
                os.unlink(tmp)


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
        engine = engine or EngineConfig()
        # The pool's chat-template options (a protocol's, for its collaborators) go to every
        # endpoint's engine, over those of the engine config.
        self.engine_config = dataclasses.replace(
            engine,
            chat_template_kwargs={**engine.chat_template_kwargs, **config.chat_template_kwargs},
        )
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
        Raises only for misuse: a closed pool, or `params.n != 1` (a call has one answer).
        """
        params.check_seeds(len(calls))
        own = [
            dataclasses.replace(params, seed=params.prompt_seed(i), seeds=())
            for i in range(len(calls))
        ]
        return await self._ask_each([Call(*c) for c in calls], own)

    async def _ask_each(self, calls: list[Call], params: list[SamplingParams]) -> list[CallRecord]:
        """`ask` with each call's own sampling parameters."""
        self._check_open()
        for p in params:
            if p.n != 1:
                raise ValueError(f"an expert call has one answer: params.n must be 1, got {p.n}")
        records: list[CallRecord | None] = [None] * len(calls)
        remote: list[int] = []
        # Local calls share a batch when only their token budgets and seeds differ.
        local: dict[tuple[str, SamplingParams], list[int]] = {}
        for i, (expert_id, prompt, reference) in enumerate(calls):
            records[i] = self._settle_early(expert_id, prompt, reference, params[i])
            if records[i] is not None:
                continue
            endpoint = self.endpoint_for(expert_id)
            assert endpoint is not None  # _settle_early records unknown ids
            if is_url(endpoint.ref):
                remote.append(i)
            else:
                local.setdefault((endpoint.ref, _shared_params(params[i])), []).append(i)
        jobs = [self._ask_remote(i, calls[i], params[i]) for i in remote]
        jobs += [
            self._ask_local(
                [(i, calls[i]) for i in g],
                _with_seeds([params[i] for i in g]),
                [params[i].max_tokens for i in g],
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
        if endpoint.ref == REFERENCE:
            return self._ask_reference(expert_id, prompt, reference, params)
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
        prompt: Prompt,
        reference: Reference | None,
        params: SamplingParams,
    ) -> CallRecord:
        """The stand-in's answer, or "unavailable" for a call that brought no reference."""
        if reference is None:
            return CallRecord(expert_id, REFERENCE_NAME, prompt, None, "unavailable", NO_REFERENCE)
        started = time.perf_counter()
        completion = reference_completion(reference, params.max_tokens, self._reference_tokenizer())
        return CallRecord(
            expert_id,
            REFERENCE_NAME,
            prompt,
            completion.text,
            "ok",
            latency_s=time.perf_counter() - started,
            completion_tokens=completion.completion_tokens,
            finish_reason=completion.finish_reason,
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
        record = _record(expert_id, endpoint, prompt, completion, error, attempts, started)
        return [(index, record)]

    async def _ask_local(
        self, items: list[tuple[int, Call]], params: SamplingParams, budgets: list[int]
    ) -> list[tuple[int, CallRecord]]:
        """All calls to one local model as one batched generate; `budgets` are the calls'
        max tokens (`params.max_tokens` is the first call's)."""
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
                return self._in_thread(
                    self._generate_locked, engine, lock, prompts, params, budgets
                )

            outputs, error, attempts = await self._with_retries(attempt, local=True)
        return [
            (
                i,
                _record(
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
        budgets: list[int],
    ) -> list[list[Completion]]:
        with lock:
            self._count_call()
            if len(set(budgets)) == 1:
                return engine.generate(prompts, dataclasses.replace(params, max_tokens=budgets[0]))
            if isinstance(engine, BudgetedEngine):
                return engine.generate_budgeted(prompts, params, budgets)
            return generate_by_budget(engine.generate, prompts, params, budgets)

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
        key = _engine_key(endpoint)
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
            # A local model runs in-process, on vLLM only when asked: `auto` would put a
            # second vLLM beside the policy's, each reserving most of a GPU's memory.
            kind = "vllm" if base.kind == "vllm" else "transformers"
            config = dataclasses.replace(base, kind=kind)
        return create_engine(endpoint.ref, config)

    def _generate_lock(self, endpoint: EndpointConfig) -> threading.Lock:
        with self._lock:
            return self._generating.setdefault(_engine_key(endpoint), threading.Lock())

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


def _shared_params(params: SamplingParams) -> SamplingParams:
    """What local calls must share to be one batch: all but the token budget and the
    seed (whether they are seeded at all does count)."""
    seed = None if params.seed is None else 0
    return dataclasses.replace(params, max_tokens=1, seed=seed, seeds=())


def _with_seeds(params: list[SamplingParams]) -> SamplingParams:
    """One batch's params: the first call's, each call keeping its own seed."""
    first = params[0]
    if first.seed is None:
        return first
    return dataclasses.replace(first, seeds=tuple(p.seed for p in params))


def _record(
    expert_id: int,
    endpoint: EndpointConfig,
    prompt: Prompt,
    completion: Completion | None,
    error: str | None,
    attempts: int,
    started: float,
) -> CallRecord:
    latency = time.perf_counter() - started
    name = endpoint_name(endpoint)
    if completion is None:
        return CallRecord(
            expert_id, name, prompt, None, "unavailable", error, latency, attempts=attempts
        )
    return CallRecord(
        expert_id,
        name,
        prompt,
        completion.text,
        "ok",
        None,
        latency,
        completion.prompt_tokens,
        completion.completion_tokens,
        attempts,
        completion.finish_reason,
    )


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------


def stats(records: list[CallRecord]) -> dict[str, int | float]:
    """Counts, mean latency of the calls that reached an engine, and token totals.

    Cached records carry the token counts of the call that produced them.
    """
    sent = [r.latency_s for r in records if r.attempts > 0]
    return {
        "calls": len(records),
        "ok": sum(r.outcome == "ok" for r in records),
        "unavailable": sum(r.outcome == "unavailable" for r in records),
        "cached": sum(r.outcome == "cached" for r in records),
        "mean_latency_s": sum(sent) / len(sent) if sent else 0.0,
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "completion_tokens": sum(r.completion_tokens for r in records),
    }


__all__ = [
    "CallRecord",
    "ExpertPool",
    "ResponseCache",
    "check_pool_config",
    "endpoint_index",
    "is_transient",
    "resolve_endpoints",
    "stats",
]
