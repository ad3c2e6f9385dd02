"""The embedded OpenAI-compatible server (FastAPI) for machines without a GPU.

Endpoints: `/health`, `/v1/models`, `/v1/completions`, `/v1/chat/completions`, and
vLLM's `/tokenize`, `/detokenize`, `/tokenizer_info` and `/metrics` (Prometheus).
Sampling fields follow the OpenAI API plus vLLM's extensions that the toolkit
sends (`top_k`, `include_stop_str_in_output`, `bad_words`, `chat_template_kwargs`,
`return_token_ids`, `return_tokens_as_token_ids`), answered in vLLM's shape. A
completion's prompt may be text, texts, token ids or lists of them; `echo` with
`logprobs` returns the prompt's log-probs (the first null), with `max_tokens` 0 too, so
that a harness (lm-eval's `local-completions`) scores choices through the server.
Every error, a 404 for a path no route serves included, is in OpenAI's shape.
`stream=true` answers in server-sent events, token by token where the engine decodes
token by token (continuous batching). `tools` reach the chat template when it renders
them; a parameter this server cannot honour (`logit_bias`, `response_format`, ...) is a
400 naming it, never dropped without a word. Each request is logged on one line.

Prompts are encoded here, before they are queued, so that what the model cannot
take is refused at once with a 400 in OpenAI's error shape: text that is not valid
Unicode, a prompt longer than the model's context (a 1 MB prompt once held the
server for eleven minutes), `max_tokens` beyond what the context leaves, a seed
outside 64 bits (vLLM's bound), a message whose role no chat template knows. A request
whose client disconnects is dropped from the queue before it is generated, or stopped
at its next token if no other request shares its batch.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TextIO, runtime_checkable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException

from collabrl.engines.base import (
    Completion,
    Prompt,
    SamplingParams,
    continues_assistant,
    encode_prompt,
)
from collabrl.serve.batcher import DynamicBatcher, ShuttingDown
from collabrl.serve.metrics import CONTENT_TYPE, ServerMetrics
from collabrl.serve.stops import StopLimits, StopScan, settled

if TYPE_CHECKING:
    from collabrl.engines.hf import TokenScore

DEFAULT_MAX_TOKENS = 1024  # when a chat request names none (OpenAI's default is "until the end")
# vLLM's bounds on `seed`: a 64-bit signed integer (torch's seeds), checked before queueing;
# 2**70 reached the generator and came back a 500.
SEED_RANGE = (-(2**63), 2**63 - 1)
# The roles a chat template knows (OpenAI's, less the deprecated "function"). vLLM passes
# any role to the template, which renders an unknown one as a turn of nobody; here it is
# a 400, so that a client's typo is not read as a prompt.
ChatRole = Literal["system", "developer", "user", "assistant", "tool"]
TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids
MAX_LOGPROBS = 20  # most alternatives per token a request may ask for (vLLM's --max-logprobs)
# OpenAI and vLLM parameters this server cannot honour, with the values that change
# nothing; any other value is a 400 naming the parameter (they used to be dropped without
# a word, so a client asking for JSON or a penalty got neither and was not told).
# Parameters that do not change the text (user, store, metadata, ...) are ignored, as vLLM does.
UNHONOURED: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "repetition_penalty": (1,),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),  # chat requests take them (see `_chat_prompt`)
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "top_logprobs": (None, 0),  # chat: only the sampled token's log-prob is returned
    "suffix": (None, ""),
    "best_of": (None, 1),
    "min_p": (0,),
    "min_tokens": (0,),
    "stop_token_ids": (None, []),
    "ignore_eos": (False,),
    "prompt_logprobs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "reasoning_effort": (None,),
    "prediction": (None,),
}


def _lone_surrogate(value: Any, path: str) -> str | None:
    """Where in a JSON value a string (or key) is not valid Unicode, or None.

    JSON may spell a lone UTF-16 surrogate ("\\ud800"), which no tokenizer and no
    UTF-8 encoder accepts.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "the request"
        return None
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return None
    for key, item in items:
        where = f"{path}.{_printable(str(key))}" if path else _printable(str(key))
        found = _lone_surrogate(key, where) or _lone_surrogate(item, where)
        if found is not None:
            return found
    return None


def _printable(text: str) -> str:
    """`text` with what UTF-8 cannot encode escaped, so that an error message can carry it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _SamplingFields(BaseModel):
    # Unknown fields are accepted, as vLLM does; kept to refuse the `UNHONOURED` ones.
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    n: int = Field(1, ge=1, le=128)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    bad_words: list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's: the sampled ids (and the prompt's) beside the text, and log-prob tokens
    # written as "token_id:N".
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = _lone_surrogate(data, "")
        if where is not None:
            raise PydanticCustomError(
                "unicode", "{where} is not valid Unicode text (a lone surrogate)", {"where": where}
            )
        return data


class CompletionRequest(_SamplingFields):
    # vLLM's and OpenAI's forms: a text, texts, token ids, lists of token ids.
    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 only with `echo`: the prompt's log-probs, nothing generated.
    max_tokens: int | None = Field(None, ge=0)
    # The sampled token's log-prob (0), with the `logprobs` likeliest tokens besides.
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # the prompt comes back before the completion, with its log-probs


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: ChatRole
    content: str | list[dict[str, Any]]


class _ChatFields(BaseModel):
    """How messages become a prompt: the chat endpoint's, and /tokenize's chat form."""

    messages: list[ChatMessage] = Field(min_length=1)
    # Rendered by the chat template when it knows them (see `_chat_prompt`); tool calls
    # come back as the model's text: there is no tool-call parser.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # vLLM's extensions for continuing a partial assistant reply (a relay teacher).
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    # vLLM's: options for the chat template, e.g. {"enable_thinking": false} (Qwen3).
    chat_template_kwargs: dict[str, Any] | None = None


class ChatRequest(_SamplingFields, _ChatFields):
    logprobs: bool = False


class TokenizeText(BaseModel):
    """vLLM's /tokenize of a text."""

    model_config = ConfigDict(extra="forbid")  # a chat field here is a mistyped request

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # vLLM's default: a BOS where the tokenizer adds one
    return_token_strs: bool = False


class TokenizeChat(_ChatFields):
    """vLLM's /tokenize of chat messages, rendered as /v1/chat/completions renders them."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    add_special_tokens: bool = False  # the chat template writes them
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


@runtime_checkable
class Scorer(Protocol):
    """An engine that scores a sequence's tokens (`TransformersEngine.score`)."""

    def score(
        self,
        ids: list[int],
        top: int,
        start: int = 1,
        scaled_from: int | None = None,
        temperature: float = 1.0,
    ) -> list[TokenScore]: ...


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def _bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "BadRequestError", param)


@dataclass(frozen=True)
class ModelLimits:
    """What the served model can take, to refuse a prompt before it is queued."""

    tokenizer: Any
    context: int | None  # tokens, prompt and completion together; None: unknown
    # The longest text one token stands for: a prompt of more than context × this many
    # characters has more tokens than the context, and is refused without tokenizing it.
    chars_per_token: int

    @classmethod
    def of(cls, tokenizer: Any, context: int | None) -> ModelLimits:
        longest = max((len(piece) for piece in tokenizer.get_vocab()), default=1)
        return cls(tokenizer, context, longest)

    def encode(self, prompt: Prompt, options: dict[str, Any] | None, param: str) -> list[int]:
        """The prompt's ids, or a 400 naming `param` when the model cannot take it."""
        if self.context is not None:
            chars = _chars(prompt)
            if chars > self.context * self.chars_per_token:
                raise _bad_request(
                    f"This model's maximum context length is {self.context} tokens; the "
                    f"prompt has {chars} characters, more than that many tokens can hold",
                    param,
                )
        try:
            ids = encode_prompt(self.tokenizer, prompt, options)
        except (TemplateError, TypeError, ValueError) as err:
            raise _bad_request(f"cannot render the prompt: {err}", param) from err
        self.check_ids(ids, param)
        if self.context is not None and len(ids) >= self.context:
            raise _bad_request(
                f"This model's maximum context length is {self.context} tokens; the prompt "
                f"has {len(ids)} tokens and at least one must be left to generate",
                param,
            )
        return ids

    def check_ids(self, ids: list[int], param: str) -> None:
        """A 400 naming `param` when an id is not in the vocabulary."""
        vocab = len(self.tokenizer)
        if any(not 0 <= i < vocab for i in ids):
            raise _bad_request(f"token ids must be in 0..{vocab - 1} (the vocabulary)", param)

    def max_tokens(self, asked: int | None, default: int, prompt_tokens: int) -> int:
        """The completion's budget: what was asked, if the context has room for it."""
        if self.context is None:
            return asked or default
        room = self.context - prompt_tokens
        if asked is None:
            return min(default, room)
        if asked > room:
            raise _bad_request(
                f"max_tokens is too large: {asked}. This model's maximum context length is "
                f"{self.context} tokens and the prompt has {prompt_tokens} ({asked} > "
                f"{self.context} - {prompt_tokens})",
                "max_tokens",
            )
        return asked


def _chars(prompt: Prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(m.get("content", "")) for m in prompt if isinstance(m, dict))


def create_app(
    batcher: DynamicBatcher,
    limits: ModelLimits,
    served_name: str,
    api_key: str | None,
    aliases: tuple[str, ...] = (),
    access_log: TextIO | None = None,
    stop_limits: StopLimits = StopLimits(),
) -> FastAPI:
    """The FastAPI app around a started-on-startup `DynamicBatcher`; one line per request
    goes to `access_log` when given; a request's stop strings must keep to `stop_limits`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="collabrl embedded server", lifespan=lifespan)
    # What /v1/models lists is exactly what `model` may name (a 404 lists the same).
    names = list(dict.fromkeys((served_name, *aliases)))
    auth = [Depends(_auth_checker(api_key))]
    tokenizer = limits.tokenizer
    scorer = batcher.engine if isinstance(batcher.engine, Scorer) else None

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError) -> JSONResponse:
        return _error(request, err.status, err.message, err.kind, err.param)

    @app.exception_handler(ShuttingDown)
    async def _shutting_down(request: Request, err: ShuttingDown) -> JSONResponse:
        return _error(request, 503, str(err), "ServiceUnavailableError")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        # OpenAI and vLLM answer 400 (not FastAPI's 422) to a malformed request.
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', err)}" if where else str(first.get("msg", err))
        return _error(request, 400, f"invalid request: {message}", "BadRequestError", where or None)

    @app.exception_handler(HTTPException)
    async def _no_route(request: Request, err: HTTPException) -> JSONResponse:
        # Starlette's own answers (a path no route serves, a method a route does not
        # take) in OpenAI's shape too, naming what is served.
        kinds = {404: "NotFoundError", 405: "MethodNotAllowedError"}
        kind = kinds.get(err.status_code, "BadRequestError")
        message = f"{err.detail}: {request.method} {request.url.path}; served: {', '.join(served)}"
        return _error(request, err.status_code, message, kind, headers=err.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception) -> JSONResponse:
        # Starlette still logs the traceback on the server; the client gets one line.
        message = f"internal error: {type(err).__name__}: {err}"
        return _error(request, 500, message, "InternalServerError")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_text() -> Response:
        # No key, as /health and vLLM's /metrics: a scraper sees counts, never a prompt.
        body = metrics.exposition(batcher.running, batcher.waiting)
        return Response(body, media_type=CONTENT_TYPE)

    @app.get("/v1/models", dependencies=auth)
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "collabrl"}
                for name in names
            ],
        }

    @app.post("/tokenize", dependencies=auth)
    async def tokenize(req: TokenizeText | TokenizeChat, request: Request) -> dict[str, Any]:
        _check_model(req.model, names, request)
        if isinstance(req, TokenizeChat):
            if req.add_special_tokens:
                raise _bad_request(
                    "add_special_tokens: the chat template writes the special tokens; only false",
                    "add_special_tokens",
                )
            messages = _messages_of(req)
            _check_continuation(req, messages)
            ids = _chat_prompt(req, messages, limits)
        else:  # any length: on a thread, while the loop serves the others
            special = req.add_special_tokens
            ids = await asyncio.to_thread(_encode_text, tokenizer, req.prompt, special)
        strings = tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
        return {
            "count": len(ids),
            "max_model_len": limits.context,
            "tokens": ids,
            "token_strs": strings,
        }

    @app.post("/detokenize", dependencies=auth)
    async def detokenize(req: DetokenizeRequest, request: Request) -> dict[str, str]:
        _check_model(req.model, names, request)
        limits.check_ids(req.tokens, "tokens")
        return {"prompt": tokenizer.decode(req.tokens)}

    @app.get("/tokenizer_info", dependencies=auth)
    async def tokenizer_info() -> dict[str, Any]:
        return _tokenizer_info(tokenizer)

    @app.post("/v1/completions", dependencies=auth, response_model=None)
    async def completions(
        req: CompletionRequest, request: Request
    ) -> dict[str, Any] | StreamingResponse:
        _check(req, names, request)
        given = _prompts_of(req.prompt)
        prompts = [limits.encode(p, None, "prompt") for p in given]
        asked = _asked(req)
        if req.stream and req.echo:
            raise _bad_request("echo is not streamed by the embedded server", "echo")
        if asked == 0 and not req.echo:
            raise _bad_request("max_tokens: 0 only with echo (the prompt alone)", "max_tokens")
        # The prompt's log-probs, or the likeliest tokens beside the sampled ones, take
        # a forward pass over the sequence once it is generated.
        scored = req.logprobs is not None and (req.echo or req.logprobs > 0)
        if scored and scorer is None:
            raise _bad_request("logprobs: this engine does not score tokens", "logprobs")
        params = None
        if asked == 0:  # nothing to generate: the prompts, echoed
            outputs = [[Completion("", [], [], prompt_tokens=len(p))] * req.n for p in prompts]
        else:
            max_tokens = limits.max_tokens(asked, 16, max(len(p) for p in prompts))
            params = _params(req, max_tokens, req.logprobs is not None, stop_limits)
            if req.stream:
                _check_stream(req, params)
                events = _streamed(batcher, request, prompts, params, tokenizer)
                return _sse(events, "text_completion", served_name, req, len(prompts))
            outputs = await _generate(batcher, request, prompts, params)
        choices = await _completion_choices(
            req, given, prompts, outputs, params, tokenizer, batcher, scorer if scored else None
        )
        request.state.usage = usage = _usage(outputs)  # the request log line reads it
        request.state.finished = [c.finish_reason for group in outputs for c in group]
        return _envelope("cmpl", "text_completion", served_name, choices, usage)

    @app.post("/v1/chat/completions", dependencies=auth, response_model=None)
    async def chat(req: ChatRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        _check(req, names, request)
        messages = _messages_of(req)
        _check_continuation(req, messages)
        prompt = _chat_prompt(req, messages, limits)
        max_tokens = limits.max_tokens(_asked(req), DEFAULT_MAX_TOKENS, len(prompt))
        params = _params(req, max_tokens, req.logprobs, stop_limits)
        if req.stream:
            _check_stream(req, params)
            events = _streamed(batcher, request, [prompt], params, tokenizer)
            return _sse(events, "chat.completion.chunk", served_name, req, 1)
        outputs = await _generate(batcher, request, [prompt], params)
        choices = [_chat_choice(j, c, req, tokenizer) for j, c in enumerate(outputs[0])]
        request.state.usage = usage = _usage(outputs)  # the request log line reads it
        request.state.finished = [c.finish_reason for c in outputs[0]]
        reply = _envelope("chatcmpl", "chat.completion", served_name, choices, usage)
        if req.return_token_ids:
            reply["prompt_token_ids"] = prompt  # vLLM puts the chat prompt's ids here
        return reply

    served = [route.path for route in app.routes if isinstance(route, APIRoute)]
    metrics = ServerMetrics(served_name, served)
    app.add_middleware(RequestRecord, metrics=metrics, out=access_log)
    return app


async def _completion_choices(
    req: CompletionRequest,
    given: list[Prompt],
    prompts: list[list[int]],
    outputs: list[list[Completion]],
    params: SamplingParams | None,
    tokenizer: Any,
    batcher: DynamicBatcher,
    scorer: Scorer | None,
) -> list[dict[str, Any]]:
    """The choices, prompt-major; with a `scorer`, each sequence is scored first (on the
    generation thread): the prompt when echoed, the completion otherwise, the completion
    under the temperature its tokens were sampled at."""
    temperature = params.temperature if params is not None and not params.greedy else 1.0
    choices = []
    for i, group in enumerate(outputs):
        echoed = _echoed(given[i], prompts[i], tokenizer) if req.echo else None
        for j, c in enumerate(group):
            scores = None
            if scorer is not None and req.logprobs is not None:
                ids, start = prompts[i] + c.token_ids, 1 if req.echo else len(prompts[i])
                scores = await batcher.call(
                    scorer.score, ids, req.logprobs, start, len(prompts[i]), temperature
                )
            choice = _completion_choice(i * req.n + j, c, req, tokenizer, prompts[i], echoed)
            if req.logprobs is not None:
                choice["logprobs"] = _completion_logprobs(c, req, tokenizer, prompts[i], scores)
            choices.append(choice)
    return choices


class RequestRecord:
    """Each request in the metrics and, when `out` is given, one line in the log, as
    uvicorn's access log and vLLM's server write it, plus the model, the token counts,
    the latency (to the last byte, a stream's included) and an error's reason."""

    def __init__(self, app: Any, metrics: ServerMetrics, out: TextIO | None) -> None:
        self.app, self.metrics, self.out = app, metrics, out

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # unless a response starts
        state = scope.setdefault("state", {})  # `request.state` of the routes

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - start
            self.metrics.observe(scope["method"], scope["path"], status, state, seconds)
            if self.out is not None:
                print(_log_line(scope, status, state, seconds), file=self.out)
                self.out.flush()


def _log_line(scope: dict, status: int, state: dict, seconds: float) -> str:
    host, port = scope.get("client") or ("-", 0)
    query = f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else ""
    request = f"{scope['method']} {scope['path']}{query} HTTP/{scope.get('http_version', '1.1')}"
    fields = [f'INFO:     {host}:{port} - "{_loggable(request)}" {status}']
    if "model" in state:
        fields.append(f"model={_loggable(state['model'])}")
    if "usage" in state:
        usage = state["usage"]
        fields.append(f"prompt_tokens={usage['prompt_tokens']}")
        fields.append(f"completion_tokens={usage['completion_tokens']}")
    if state.get("abandoned"):
        fields.append("client closed the stream")
    fields.append(f"latency={seconds:.3f}s")
    if "error" in state:  # why it was refused, as its client was told
        fields.append(f'error="{_loggable(state["error"])}"')
    return " ".join(fields)


# Characters a client may put in a logged field (a path's %0A arrives decoded) that would
# end the line or fake one, move a terminal's cursor, or blur where the quoted request
# ends: C0 and C1 controls, DEL, Unicode's line and paragraph separators, `"` and `\`.
_LOG_ESCAPES = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (*range(0x20), 0x22, 0x5C, *range(0x7F, 0xA0), 0x2028, 0x2029)
}


def _loggable(text: str) -> str:
    """`text` with what could forge or break a log line escaped (`\\xNN`): each request
    is one line, whatever its path."""
    return _printable(text.translate(_LOG_ESCAPES))


async def _generate(
    batcher: DynamicBatcher, request: Request, prompts: list[Prompt], params: SamplingParams
) -> list[list[Completion]]:
    """The batcher's answer; when the client disconnects first, its job is dropped before
    it is generated (abandoned requests once held the queue for minutes)."""
    job = asyncio.ensure_future(batcher.submit(prompts, params))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((job, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        job.cancel()  # a no-op once answered: otherwise nobody waits for it any more
    if job.cancelled():
        raise APIError(499, "the client closed the request", "ClientClosedRequest")
    return job.result()


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body has been read already, so
    the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _streamed(
    batcher: DynamicBatcher,
    request: Request,
    prompts: list[Prompt],
    params: SamplingParams,
    tokenizer: Any,
) -> AsyncIterator[tuple[int, str, Completion | None]]:
    """(row, new text, None) as the rows grow, then (row, the rest, its completion) for
    each row in order once all are done; rows are prompt-major, `n` per prompt.

    Decoding a row's tokens and looking for its stop strings run on a thread, not on the
    event loop, which serves every other client meanwhile; tokens that came while they
    ran are taken together, each row at its newest. Closing the stream (the client went
    away: Starlette cancels it) cancels the job, and the batcher stops a generation
    nobody waits for."""
    texts = [_StreamedText(tokenizer, params) for _ in range(len(prompts) * params.n)]
    grown: asyncio.Queue[tuple[int, list[int]]] = asyncio.Queue()
    job = asyncio.ensure_future(
        batcher.submit(prompts, params, lambda row, tokens: grown.put_nowait((row, tokens)))
    )
    update: asyncio.Future | None = None
    try:
        while True:
            update = asyncio.ensure_future(grown.get())
            await asyncio.wait((job, update), return_when=asyncio.FIRST_COMPLETED)
            if not update.done():  # the job is done; what it grew since is in its answer
                break
            newest = dict([update.result()])
            while not grown.empty():  # each update holds all of its row's tokens
                row, tokens = grown.get_nowait()
                newest[row] = tokens
            for row, new in await asyncio.to_thread(_grow, texts, newest):
                yield row, new, None
        outputs = job.result()
    finally:
        if not job.done():
            request.state.abandoned = True
        job.cancel()
        if update is not None:
            update.cancel()
    request.state.usage = _usage(outputs)
    finished = [c for group in outputs for c in group]
    request.state.finished = [c.finish_reason for c in finished]
    for row, completion in enumerate(finished):
        yield row, texts[row].finish(completion.text), completion


def _grow(texts: list[_StreamedText], newest: dict[int, list[int]]) -> list[tuple[int, str]]:
    """Each row's new text to send, from its newest tokens (rows with none left out)."""
    grown = ((row, texts[row].grow(tokens)) for row, tokens in newest.items())
    return [(row, new) for row, new in grown if new]


class _StreamedText:
    """A row's text as its tokens come, sent only where later tokens cannot change it: it
    holds back trailing whitespace and half a UTF-8 character (a decoder may join them
    with the next token), and the start of a stop string (cut if it completes)."""

    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self.tokenizer, self.stops = tokenizer, params.stop
        self.scan = StopScan(params.stop, params.include_stop)
        self.sent = ""

    def grow(self, tokens: list[int]) -> str:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        text, hit = self.scan.cut(text)
        if hit is None:
            text = settled(text, self.stops)
        return self._send(text)

    def finish(self, text: str) -> str:
        return self._send(text)

    def _send(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""  # cannot happen given what `grow` holds back; sent text is not taken back
        new, self.sent = text[len(self.sent) :], text
        return new


def _sse(
    events: AsyncIterator[tuple[int, str, Completion | None]],
    kind: str,
    model: str,
    req: _SamplingFields,
    prompts: int,
) -> StreamingResponse:
    """The events in OpenAI's server-sent-event shape: `data: {chunk}` per event, a chat
    stream opening each choice with its role, the last chunk of a choice carrying its
    finish reason, a usage chunk when `stream_options.include_usage`, then `data: [DONE]`.
    An error after the stream began is an `error` event (the status is sent already)."""
    chat = kind == "chat.completion.chunk"
    usage = req.stream_options is not None and req.stream_options.include_usage
    head = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }

    def chunk(choices: list[dict[str, Any]], counts: dict[str, int] | None = None) -> str:
        body = {**head, "choices": choices, **({"usage": counts} if usage else {})}
        return f"data: {json.dumps(body)}\n\n"

    def choice(row: int, text: str, done: Completion | None) -> dict[str, Any]:
        end = {
            "logprobs": None,
            "finish_reason": done and done.finish_reason,
            "stop_reason": done and done.stop_reason,
        }
        if not chat:
            return {"index": row, "text": text, **end}
        return {"index": row, "delta": {"content": text} if text else {}, **end}

    async def body() -> AsyncIterator[str]:
        finished: list[Completion] = []
        try:
            if chat:
                opening = {"role": "assistant", "content": ""}
                rows = range(prompts * req.n)
                yield chunk([{"index": r, "delta": opening, "finish_reason": None} for r in rows])
            async for row, text, done in events:
                if text or done is not None:
                    yield chunk([choice(row, text, done)])
                if done is not None:
                    finished.append(done)
            if usage:
                groups = [finished[i : i + req.n] for i in range(0, len(finished), req.n)]
                yield chunk([], _usage(groups))
        except APIError as err:
            yield _error_event(err.status, err.message, err.kind)
        except ShuttingDown as err:
            yield _error_event(503, str(err), "ServiceUnavailableError")
        except Exception as err:  # noqa: BLE001 - the client gets one line, as a 500 would
            yield _error_event(
                500, f"internal error: {type(err).__name__}: {err}", "InternalServerError"
            )
        finally:  # a closed stream ends its job now, wherever it was cancelled
            await events.aclose()
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def _error_event(status: int, message: str, kind: str) -> str:
    error = {"message": _printable(message), "type": kind, "param": None, "code": status}
    return f"data: {json.dumps({'error': error})}\n\n"


def _auth_checker(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        if not secrets.compare_digest(token.encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key", "AuthenticationError")

    return check


def _check(req: _SamplingFields, names: list[str], request: Request) -> None:
    """Refuse a model not served, a parameter not honoured, a stream option without a
    stream; the request log names the model from here on."""
    _check_model(req.model, names, request)
    for name, value in (req.model_extra or {}).items():
        if name in UNHONOURED and value not in UNHONOURED[name]:
            raise _bad_request(
                f"{name} is not supported by the embedded server (only "
                f"{' or '.join(json.dumps(v) for v in UNHONOURED[name])})",
                name,
            )
    if req.stream_options is not None and not req.stream:
        raise _bad_request("stream_options needs stream=true", "stream_options")


def _check_model(model: str | None, names: list[str], request: Request) -> None:
    """A 404 for a model not served (None: the served one, as vLLM's /tokenize takes it);
    the request log names the model from here on."""
    if model is None:
        return
    if model not in names:
        raise APIError(
            404,
            f"model '{model}' does not exist; served: {', '.join(names)}",
            "NotFoundError",
            "model",
        )
    request.state.model = model


def _check_stream(req: _SamplingFields, params: SamplingParams) -> None:
    """What a stream does not carry is refused rather than left out."""
    for param, asked in (("logprobs", params.logprobs), ("return_token_ids", req.return_token_ids)):
        if asked:
            raise _bad_request(f"{param} is not streamed by the embedded server", param)


def _messages_of(req: _ChatFields) -> list[dict[str, str]]:
    return [{"role": m.role, "content": _text_of(m.content)} for m in req.messages]


def _chat_prompt(
    req: _ChatFields, messages: list[dict[str, str]], limits: ModelLimits
) -> list[int]:
    """The chat prompt's ids, with `tools` rendered by the chat template. A template that
    ignores them (SmolLM2's) would leave the model unaware of them: a 400, not a prompt
    without tools."""
    options = dict(req.chat_template_kwargs or {})
    if not req.add_generation_prompt:  # vLLM's field: render without the assistant header
        options["add_generation_prompt"] = False
    if not req.tools:
        if req.tool_choice not in UNHONOURED["tool_choice"]:
            raise _bad_request("tool_choice needs tools", "tool_choice")
        return limits.encode(messages, options or None, "messages")
    if req.tool_choice == "none":  # OpenAI: the model is to call no tool; it is not shown any
        return limits.encode(messages, options or None, "messages")
    if req.tool_choice not in (None, "auto"):
        raise _bad_request(
            "tool_choice: only auto or none (this server does not force a tool call)",
            "tool_choice",
        )
    prompt = limits.encode(messages, {**options, "tools": req.tools}, "tools")
    if prompt == limits.encode(messages, options or None, "messages"):
        raise _bad_request(
            "tools: this model's chat template does not render tools, so the model would "
            "never see them; describe them in a message instead",
            "tools",
        )
    return prompt


def _check_continuation(req: _ChatFields, messages: list[dict[str, str]]) -> None:
    """The engines continue a final assistant message; say so rather than guess."""
    if req.continue_final_message != continues_assistant(messages):
        raise _bad_request(
            "continue_final_message=true needs a final assistant message, and a final "
            "assistant message needs continue_final_message=true",
            "continue_final_message",
        )


def _prompts_of(prompt: str | list[str] | list[int] | list[list[int]]) -> list[Prompt]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise _bad_request("prompt is empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # one prompt given as token ids
    if any(isinstance(p, list) and not p for p in prompt):
        raise _bad_request("prompt: a list of token ids is empty", "prompt")
    return list(prompt)  # a batch of texts, or of token-id lists (lm-eval's default)


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _asked(req: _SamplingFields) -> int | None:
    return req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens


def _params(
    req: _SamplingFields, max_tokens: int, logprobs: bool, stop_limits: StopLimits
) -> SamplingParams:
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    try:
        stop_limits.check(stop)
    except ValueError as err:
        raise _bad_request(str(err), "stop") from err
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            n=req.n,
            seed=req.seed,
            stop=stop,
            include_stop=req.include_stop_str_in_output,
            banned=tuple(req.bad_words or ()),
            logprobs=logprobs,
        )
    except ValueError as err:
        raise _bad_request(str(err)) from err


def _token_texts(ids: list[int], req: _SamplingFields, tokenizer: Any) -> list[str]:
    """The log-prob entries' tokens: their text, or vLLM's "token_id:N" when asked."""
    if req.return_tokens_as_token_ids:
        return [f"{TOKEN_ID_PREFIX}{i}" for i in ids]
    return [tokenizer.decode([i]) for i in ids]


def _echoed(given: Prompt, ids: list[int], tokenizer: Any) -> str:
    """The prompt's text before an echoed completion: as sent, or its ids decoded."""
    return given if isinstance(given, str) else tokenizer.decode(ids)


def _completion_choice(
    index: int,
    c: Completion,
    req: CompletionRequest,
    tokenizer: Any,
    prompt: list[int],
    echoed: str | None,
) -> dict[str, Any]:
    choice = {
        "index": index,
        "text": c.text if echoed is None else echoed + c.text,
        "logprobs": None,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }
    if req.return_token_ids:
        # As vLLM: every sampled id, the EOS that ended the completion included.
        choice.update(token_ids=c.token_ids, prompt_token_ids=prompt)
    return choice


def _completion_logprobs(
    c: Completion,
    req: CompletionRequest,
    tokenizer: Any,
    prompt: list[int],
    scores: list[TokenScore] | None,
) -> dict[str, Any] | None:
    """The legacy `logprobs` object: each token (the prompt's first when echoed), its
    log-prob (null for the first prompt token: nothing precedes it), a map of the
    likeliest tokens there plus the token itself, and where its text starts in the
    choice's text. `scores` are the scored places, from the prompt's second token when
    echoed, else from the completion's first; without them only the sampled tokens are
    known."""
    if c.logprobs is None:
        return None
    ids: list[int] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    if req.echo:
        assert scores is not None
        scored_prompt, scores = scores[: len(prompt) - 1], scores[len(prompt) - 1 :]
        ids += prompt
        values += [None, *(s.logprob for s in scored_prompt)]
        tops += [None]
        for score, token in zip(scored_prompt, prompt[1:], strict=True):
            tops.append(_top_map(score, token, score.logprob, req, tokenizer))
    # The completion's tokens keep their log-probs as sampled.
    for k, (token, value) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
        ids.append(token)
        values.append(value)
        tops.append(_top_map(scores[k] if scores else None, token, value, req, tokenizer))
    texts = _token_texts(ids, req, tokenizer)
    offsets = [0, *itertools.accumulate(len(t) for t in texts)][: len(texts)]
    return {"tokens": texts, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _top_map(
    score: TokenScore | None, token: int, value: float, req: _SamplingFields, tokenizer: Any
) -> dict[str, float]:
    """The likeliest tokens at a place with their log-probs, and the token there with
    its own, written last so that it wins where two ids share a text."""
    top = [*(score.top if score is not None else ()), (token, value)]
    texts = _token_texts([i for i, _ in top], req, tokenizer)
    return dict(zip(texts, (lp for _, lp in top), strict=True))


def _chat_choice(index: int, c: Completion, req: ChatRequest, tokenizer: Any) -> dict[str, Any]:
    logprobs = None
    if req.logprobs and c.logprobs is not None:
        tokens = _token_texts(c.token_ids, req, tokenizer)
        content = [
            {"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": []}
            for token, lp in zip(tokens, c.logprobs, strict=True)
        ]
        logprobs = {"content": content}
    choice = {
        "index": index,
        "message": {"role": "assistant", "content": c.text},
        "logprobs": logprobs,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }
    if req.return_token_ids:
        choice["token_ids"] = c.token_ids
    return choice


def _envelope(
    prefix: str, kind: str, model: str, choices: list, usage: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def _usage(outputs: list[list[Completion]]) -> dict[str, int]:
    # Every sample of a prompt saw the same prompt: count it once per prompt.
    prompt_tokens = sum(group[0].prompt_tokens for group in outputs if group)
    completion_tokens = sum(c.completion_tokens for group in outputs for c in group)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _error(
    request: Request,
    status: int,
    message: str,
    kind: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape; the request's log line gives its message."""
    request.state.error = message
    error = {"message": _printable(message), "type": kind, "param": param, "code": status}
    return JSONResponse(status_code=status, content={"error": error}, headers=headers)


def _encode_text(tokenizer: Any, text: str, special: bool) -> list[int]:
    return tokenizer(text, add_special_tokens=special)["input_ids"]


def _tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """vLLM's /tokenizer_info: the tokenizer's settings as its tokenizer_config.json holds
    them (files' paths aside), its class, special tokens and chat template."""
    info = {
        key: _json_value(value)
        for key, value in (getattr(tokenizer, "init_kwargs", None) or {}).items()
        if not key.endswith("_file")
    }
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        info[name] = getattr(tokenizer, name, None)
    info["tokenizer_class"] = type(tokenizer).__name__
    if getattr(tokenizer, "chat_template", None):
        info["chat_template"] = tokenizer.chat_template
    return info


def _json_value(value: Any) -> Any:
    """`value` as JSON can hold it: a special token as its text, anything else unknown
    as its repr."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if hasattr(value, "content"):  # transformers' AddedToken
        return value.content
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return repr(value)
