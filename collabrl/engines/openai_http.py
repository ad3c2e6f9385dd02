"""An Engine that talks to any OpenAI-compatible HTTP server.

Works against vLLM's `vllm serve`, our own embedded server, and hosted APIs. Text and
token-id prompts go to `/v1/completions` (vLLM accepts a list of ints as `prompt`); chat
message lists go to `/v1/chat/completions`, where the server applies its chat template.

Request building, response parsing and error mapping are pure functions so they can be
tested without a network. The engine itself owns one `openai.AsyncOpenAI` client that
lives on a private event loop in a daemon thread: an async HTTP client's connection pool
is bound to the loop it first ran on, so reusing it across `asyncio.run` calls (one per
`generate`) would break on the second call. Routing every request through one loop lets
`generate` work from plain code, from inside a running loop (notebooks), and lets
`agenerate` be awaited from any loop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import threading
from collections.abc import Mapping
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import openai

from collabrl.engines.base import (
    Completion,
    Prompt,
    SamplingParams,
    continues_assistant,
    cut_at_stop,
)
from collabrl.engines.loop import LoopThread
from collabrl.errors import UserError

EndpointKind = Literal["chat", "completions"]
T = TypeVar("T")

_SERVE_HINT = "is the server running? start one with `collab serve`"


# ---------------------------------------------------------------------------------------------
# Configuration helpers
# ---------------------------------------------------------------------------------------------


def resolve_api_key(api_key: str | None) -> str:
    """Pick the API key: the argument, then COLLABRL_API_KEY, then OPENAI_API_KEY, then "EMPTY".

    vLLM started without `--api-key` accepts any key, but the openai client refuses to
    send a request without one, hence the placeholder. Empty strings count as unset.
    """
    return (
        api_key or os.environ.get("COLLABRL_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    )


def normalize_base_url(base_url: str) -> str:
    """Strip trailing slashes and add `/v1` when the URL is a bare host.

    Users naturally type `http://localhost:8000`; the client needs the API root. A URL
    that already has a path (`.../v1`, `.../v1beta/openai`) is left as given.
    """
    url = base_url.strip().rstrip("/")
    bad = UserError(
        f"base URL {base_url!r} is not a valid http(s) URL",
        "pass something like http://localhost:8000/v1",
    )
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is no number in 0..65535
    except ValueError as err:  # e.g. an unclosed IPv6 bracket
        raise bad from err
    if parts.scheme not in ("http", "https") or not _valid_host(parts.hostname or ""):
        raise bad
    if parts.path in ("", "/"):
        url += "/v1"
    return url


def _valid_host(host: str) -> bool:
    """Whether the HTTP client takes `host`: it refuses (with its own error class, at
    construction) blanks, control characters and a dotted quad that is no IPv4 address."""
    if not host or not host.isprintable() or any(c.isspace() for c in host):
        return False
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Request building
# ---------------------------------------------------------------------------------------------


def prompt_kind(prompt: Prompt) -> EndpointKind:
    """Which endpoint serves this prompt: chat for message lists, completions otherwise."""
    if isinstance(prompt, str):
        return "completions"
    if isinstance(prompt, list) and prompt:
        if all(isinstance(m, dict) for m in prompt):
            return "chat"
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return "completions"
    raise ValueError(
        "a prompt must be a string, a non-empty list of chat messages or a non-empty "
        f"list of token ids, got {type(prompt).__name__}: {prompt!r:.80}"
    )


def _extra_body(params: SamplingParams) -> dict[str, Any]:
    """vLLM sampling extensions; the openai client merges these into the JSON body.

    Only what a request needs is sent: hosted APIs reject parameters they do not know.
    """
    extra: dict[str, Any] = {}
    if params.top_k > 0:
        extra["top_k"] = params.top_k
    if params.include_stop:
        extra["include_stop_str_in_output"] = True
    if params.banned:
        extra["bad_words"] = list(params.banned)
    return extra


def row_params(params: SamplingParams, row: int) -> SamplingParams:
    """The params of one prompt of a batch, sent as its own request: its own seed (the
    prompt's own, else seed + row) and its own most new tokens (`params.for_prompt`).

    A server seeds every request on its own, so one shared seed would make a batch's
    equal prompts (the samples of one problem) sample the very same text.
    """
    if params.seed is None and not params.seeds and not params.budgets:
        return params
    return params.for_prompt(row)


def build_request(
    prompt: Prompt,
    params: SamplingParams,
    model: str,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[str, dict]:
    """Return the endpoint kind and the keyword arguments for its `create` call.

    Optional fields are omitted rather than sent as null/defaults, because some servers
    reject parameters they do not know or values they do not support.
    """
    kind = prompt_kind(prompt)
    kwargs: dict[str, Any] = {
        "model": model,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "n": params.n,
    }
    if params.seed is not None:
        kwargs["seed"] = params.seed
    if params.stop:
        kwargs["stop"] = list(params.stop)
    if kind == "chat":
        kwargs["messages"] = list(prompt)
        if params.logprobs:
            # top_logprobs=0: we only want the sampled token's log-prob, not alternatives.
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = 0
    else:
        kwargs["prompt"] = prompt if isinstance(prompt, str) else list(prompt)
        if params.logprobs:
            # 1 rather than 0: some servers treat 0 as "off"; every server that supports
            # logprobs returns the sampled token's log-prob in token_logprobs with 1.
            kwargs["logprobs"] = 1
    extra = _extra_body(params)
    if kind == "chat":
        if continues_assistant(prompt):
            # vLLM's chat extensions for continuing a partial assistant reply.
            extra.update(continue_final_message=True, add_generation_prompt=False)
        if chat_template_kwargs:
            extra["chat_template_kwargs"] = dict(chat_template_kwargs)
    elif not isinstance(prompt, str):
        # A caller that speaks token ids wants the sampled ids back, not text to re-encode
        # (which loses the EOS and can split differently). vLLM >= 0.10.2 and `collab
        # serve` answer `token_ids`; older vLLM writes the ids into the log-prob tokens.
        extra["return_token_ids"] = True
        if params.logprobs:
            extra["return_tokens_as_token_ids"] = True
    if extra:
        kwargs["extra_body"] = extra
    return kind, kwargs


# ---------------------------------------------------------------------------------------------
# Response parsing
# ---------------------------------------------------------------------------------------------


def _choice_text(choice: Any, kind: str) -> str:
    if kind == "chat":
        message = getattr(choice, "message", None)
        # Content is None for refusals or tool calls; treat that as an empty answer.
        return (getattr(message, "content", None) or "") if message is not None else ""
    return getattr(choice, "text", None) or ""


def _choice_logprobs(choice: Any, kind: str) -> tuple[list[float] | None, list[str] | None]:
    """The sampled tokens' log-probs and, when given, their text pieces."""
    lp = getattr(choice, "logprobs", None)
    if lp is None:
        return None, None
    if kind == "chat":
        content = getattr(lp, "content", None)
        if content is None:
            return None, None
        return [float(t.logprob) for t in content], [t.token for t in content]
    values = getattr(lp, "token_logprobs", None)
    if values is None:
        return None, None
    # The first token of an echoed prompt has logprob None; we never echo, but be safe.
    logprobs = [float(v) if v is not None else 0.0 for v in values]
    tokens = getattr(lp, "tokens", None)
    return logprobs, (list(tokens) if tokens is not None else None)


def _keep_logprobs(logprobs: list[float], tokens: list[str] | None, keep_chars: int) -> list[float]:
    """Drop log-probs of tokens that start at or after `keep_chars` in the text.

    Used only when we cut a stop string the server did not honour; without token texts
    we cannot tell where to cut, so the list is returned unchanged.
    """
    if tokens is None or len(tokens) != len(logprobs):
        return logprobs
    kept: list[float] = []
    start = 0
    for value, piece in zip(logprobs, tokens, strict=True):
        if start >= keep_chars:
            break
        kept.append(value)
        start += len(piece)
    return kept


_TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids


def _choice_token_ids(choice: Any, tokens: list[str] | None) -> list[int]:
    """The sampled ids, when the server gave them; empty otherwise."""
    ids = getattr(choice, "token_ids", None)
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return list(ids)
    if tokens and all(t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
        try:
            return [int(t.removeprefix(_TOKEN_ID_PREFIX)) for t in tokens]
        except ValueError:
            return []
    return []


def parse_choice(
    choice: Any, kind: str, params: SamplingParams, prompt_tokens: int = 0
) -> Completion:
    """Turn one response choice (chat or completions) into a Completion."""
    text = _choice_text(choice, kind)
    logprobs, tokens = _choice_logprobs(choice, kind) if params.logprobs else (None, None)
    token_ids = _choice_token_ids(choice, tokens)
    finish = "length" if getattr(choice, "finish_reason", None) == "length" else "stop"
    # vLLM puts the matched stop string here (or a stop token id, which we ignore).
    raw_stop = getattr(choice, "stop_reason", None)
    stop_reason = raw_stop if isinstance(raw_stop, str) else None

    if params.stop:
        # Some servers ignore `stop` (or n>1 paths drop it); enforce it on our side too.
        # When the server did honour it, the text either lacks the stop string or ends
        # with it (include_stop), and cutting changes nothing.
        kept, hit = cut_at_stop(text, params.stop, params.include_stop)
        if hit is not None:
            if len(kept) < len(text):
                if logprobs is not None:
                    logprobs = _keep_logprobs(logprobs, tokens, len(kept))
                token_ids = []  # where the cut text ends among the ids is unknown
            text, finish, stop_reason = kept, "stop", stop_reason or hit

    return Completion(
        text=text,
        token_ids=token_ids,  # empty when the server gave none (plain OpenAI APIs)
        logprobs=logprobs,
        finish_reason=finish,
        stop_reason=stop_reason,
        prompt_tokens=prompt_tokens,
    )


def parse_response(response: Any, kind: str, params: SamplingParams) -> list[Completion]:
    """All choices of one response, in `index` order, with the prompt's token count."""
    usage = getattr(response, "usage", None)
    prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0) if usage is not None else 0
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list):  # e.g. an HTML page, which the client returns as text
        raise ValueError(f"no list of choices in a {type(response).__name__}")
    choices = sorted(choices, key=lambda c: getattr(c, "index", 0) or 0)
    completions = [parse_choice(c, kind, params, prompt_tokens) for c in choices]
    # Usage sums over all choices, so it is one completion's count only when there is one.
    reported = getattr(usage, "completion_tokens", None) if usage is not None else None
    if len(completions) == 1 and isinstance(reported, int):
        completions[0].reported_tokens = reported
    return completions


# No tokenizer's piece is longer than this (the longest are runs of spaces or dashes): a
# longer answer comes from a server that ignored max_tokens, and would only fill memory.
MAX_CHARS_PER_TOKEN = 256


def check_lengths(completions: list[Completion], max_tokens: int) -> None:
    """Raise ValueError for a completion longer than `max_tokens` tokens can be."""
    for completion in completions:
        if len(completion.text) > max_tokens * MAX_CHARS_PER_TOKEN:
            raise ValueError(f"{len(completion.text)} characters for at most {max_tokens} tokens")


# ---------------------------------------------------------------------------------------------
# Error mapping
# ---------------------------------------------------------------------------------------------


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own explanation, on one short line."""
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    text = str(message) if message else exc.message
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:297] + "..."


def bad_response(base_url: str, err: Exception) -> UserError:
    """A server's answer that is not an OpenAI-compatible response, as one line."""
    reason = " ".join(str(err).split())
    reason = reason if len(reason) <= 200 else reason[:197] + "..."
    return UserError(
        f"{base_url} answered with something that is not an OpenAI-compatible response "
        f"({type(err).__name__}: {reason})",
        "check that the URL is the API root of an OpenAI-compatible server (collab serve, vLLM)",
    )


def map_error(exc: Exception, base_url: str, model: str) -> UserError:
    """Translate an openai client exception into a one-line UserError with a fix."""
    if isinstance(exc, openai.AuthenticationError):
        return UserError(
            f"endpoint {base_url} rejected the API key", "pass --api-key or set COLLABRL_API_KEY"
        )
    if isinstance(exc, openai.NotFoundError):
        if not model:  # raised while discovering the model: /models itself is missing
            return UserError(
                f"{base_url}/models was not found",
                "pass the server's OpenAI API root as the base URL (usually ending in /v1)",
            )
        return UserError(
            f"model '{model}' is not served at {base_url}",
            f"check `GET {base_url}/models` for the served names",
        )
    if isinstance(exc, openai.APITimeoutError):  # subclass of APIConnectionError: test first
        return UserError(
            f"cannot reach {base_url}: the request timed out",
            f"{_SERVE_HINT}; for long generations raise the timeout",
        )
    if isinstance(exc, openai.APIConnectionError):
        return UserError(f"cannot reach {base_url}", _SERVE_HINT)
    if isinstance(exc, openai.BadRequestError):
        return UserError(
            f"{base_url} rejected the request: {_server_message(exc)}",
            "check the sampling parameters and the prompt length against the server's limits",
        )
    if isinstance(exc, openai.APIStatusError):
        return UserError(
            f"{base_url} answered HTTP {exc.status_code}: {_server_message(exc)}",
            "check the server's log",
        )
    return UserError(f"request to {base_url} failed: {exc}", "check the server's log")


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


class OpenAIEngine:
    """Engine over an OpenAI-compatible `/v1/completions` + `/v1/chat/completions` server."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 16,
        timeout: float = 600.0,
        max_retries: int = 3,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_concurrency = max_concurrency
        self.name = self._make_name()
        # The client's own retry (exponential backoff) covers 408/429/5xx and
        # connection errors, so we do not add another retry layer on top.
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=resolve_api_key(api_key),
            timeout=timeout,
            max_retries=max_retries,
        )
        self._runner: LoopThread | None = None
        self._runner_lock = threading.Lock()
        # Created on the private loop by the first request (asyncio primitives bind there).
        self._semaphore: asyncio.Semaphore | None = None
        self._model_lock: asyncio.Lock | None = None
        self._closed = False

    def _make_name(self) -> str:
        return f"openai:{self.model or 'auto'}@{self.base_url}"

    # -- event loop plumbing ------------------------------------------------------------------

    def _get_runner(self) -> LoopThread:
        if self._closed:
            raise RuntimeError(f"{self.name} is closed")
        with self._runner_lock:
            if self._runner is None:
                self._runner = LoopThread("collabrl-openai-http")
            return self._runner

    # -- generation ---------------------------------------------------------------------------

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """Return `params.n` completions for every prompt, in prompt order (blocking).

        Safe to call with an event loop already running in this thread: the work happens
        on the engine's own loop thread, this thread only waits.
        """
        return self._get_runner().submit(self._generate_on_loop(prompts, params))

    async def agenerate(
        self, prompts: list[Prompt], params: SamplingParams
    ) -> list[list[Completion]]:
        """Async `generate`: one request per prompt, sent concurrently, bounded in flight."""
        runner = self._get_runner()
        coro = self._generate_on_loop(prompts, params)
        if asyncio.get_running_loop() is runner.loop:
            return await coro
        # Cancelling the awaiting task cancels the work on the engine's loop as well.
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, runner.loop))

    async def _generate_on_loop(
        self, prompts: list[Prompt], params: SamplingParams
    ) -> list[list[Completion]]:
        params.check_seeds(len(prompts))
        params.check_budgets(len(prompts))
        # Validate every prompt before sending anything, so a bad prompt fails fast.
        requests = [
            build_request(p, row_params(params, i), self.model or "", self.chat_template_kwargs)
            for i, p in enumerate(prompts)
        ]
        if not requests:
            return []
        try:
            model = await self._ensure_model()
            if self._semaphore is None:
                self._semaphore = asyncio.Semaphore(self.max_concurrency)
            return list(
                await asyncio.gather(
                    *(self._send(kind, {**kw, "model": model}, params) for kind, kw in requests)
                )
            )
        except openai.OpenAIError as exc:
            raise map_error(exc, self.base_url, self.model or "") from exc

    async def _send(self, kind: str, kwargs: dict, params: SamplingParams) -> list[Completion]:
        assert self._semaphore is not None
        async with self._semaphore:
            try:
                if kind == "chat":
                    response = await self._client.chat.completions.create(**kwargs)
                else:
                    response = await self._client.completions.create(**kwargs)
            except ValueError as err:  # the body is not UTF-8, or not JSON
                raise bad_response(self.base_url, err) from err
        try:
            completions = parse_response(response, kind, params)
            check_lengths(completions, kwargs["max_tokens"])
        except (ValueError, TypeError) as err:  # JSON, but not a completion of this request
            raise bad_response(self.base_url, err) from err
        return completions

    async def _ensure_model(self) -> str:
        """The model to request, asking `GET /models` once when none was given."""
        if self.model:
            return self.model
        if self._model_lock is None:
            self._model_lock = asyncio.Lock()
        async with self._model_lock:  # concurrent first calls must not all ask
            if not self.model:
                try:
                    page = await self._client.models.list()
                # Not UTF-8 or not JSON; a text body the client fails to page (AttributeError).
                except (ValueError, AttributeError) as err:
                    raise bad_response(self.base_url, err) from err
                if not page.data:
                    raise UserError(
                        f"{self.base_url} serves no models", "pass the model name explicitly"
                    )
                self.model = page.data[0].id
                self.name = self._make_name()
        return self.model

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP client and stop the engine's loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._runner_lock:
            runner, self._runner = self._runner, None
        if runner is None:
            return  # never used: the client holds no connections yet
        try:
            runner.submit(self._client.close())
        finally:
            runner.stop()

    def __enter__(self) -> OpenAIEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAIEngine({self.name!r})"


__all__ = [
    "OpenAIEngine",
    "build_request",
    "map_error",
    "normalize_base_url",
    "parse_choice",
    "parse_response",
    "prompt_kind",
    "resolve_api_key",
]
