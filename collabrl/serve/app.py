"""The embedded OpenAI-compatible server (FastAPI) for machines without a GPU: its routes,
its error handlers and the app that holds them.

Endpoints: `/health`, `/v1/models`, `/v1/completions`, `/v1/chat/completions`, and
vLLM's `/tokenize`, `/detokenize`, `/tokenizer_info` and `/metrics` (Prometheus). A
completion's prompt may be text, texts, token ids or lists of them; `echo` with
`logprobs` returns the prompt's log-probs (the first null), with `max_tokens` 0 too, so
that a harness (lm-eval's `local-completions`) scores choices through the server; a
chat reply's `logprobs` carry `top_logprobs` as OpenAI's do.
Every error, a 404 for a path no route serves included, is in OpenAI's shape. A request
whose client disconnects is dropped from the queue before it is generated, or stopped
at its next token if no other request shares its batch.

Each route reads and writes the OpenAI API's bodies (`serve/openai_api.py`: the
requests with vLLM's extensions, the parameters refused rather than dropped, the
responses), turns a request into prompt ids and sampling params checked against the
model before anything is queued (`serve/inputs.py`), answers `stream=true` in
server-sent events (`serve/streaming.py`), and is counted and logged on one line
(`serve/access_log.py`, `serve/metrics.py`). The batcher (`serve/batcher.py`) runs them.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, TextIO, runtime_checkable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from collabrl.engines.base import Completion, Prompt, SamplingParams
from collabrl.serve.access_log import RequestRecord
from collabrl.serve.batcher import DynamicBatcher, ShuttingDown
from collabrl.serve.inputs import (
    ModelLimits,
    asked_tokens,
    chat_prompt,
    check_continuation,
    messages_of,
    prompts_of,
    sampling_params,
)
from collabrl.serve.metrics import CONTENT_TYPE, ServerMetrics
from collabrl.serve.openai_api import (
    UNHONOURED,
    APIError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingFields,
    TokenizeChat,
    TokenizeText,
    bad_request,
    chat_choice,
    completion_choice,
    completion_logprobs,
    echoed_prompt,
    envelope,
    error_body,
    usage_of,
)
from collabrl.serve.stops import StopLimits
from collabrl.serve.streaming import check_streamable, sse_response, streamed

if TYPE_CHECKING:
    from collabrl.engines.hf import TokenScore

DEFAULT_MAX_TOKENS = 1024  # when a chat request names none (OpenAI's default is "until the end")


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
                raise bad_request(
                    "add_special_tokens: the chat template writes the special tokens; only false",
                    "add_special_tokens",
                )
            messages = messages_of(req)
            check_continuation(req, messages)
            ids = chat_prompt(req, messages, limits)
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
        given = prompts_of(req.prompt)
        prompts = [limits.encode(p, None, "prompt") for p in given]
        asked = asked_tokens(req)
        if req.stream and req.echo:
            raise bad_request("echo is not streamed by the embedded server", "echo")
        if asked == 0 and not req.echo:
            raise bad_request("max_tokens: 0 only with echo (the prompt alone)", "max_tokens")
        # The prompt's log-probs, or the likeliest tokens beside the sampled ones, take
        # a forward pass over the sequence once it is generated.
        scored = req.logprobs is not None and (req.echo or req.logprobs > 0)
        if scored and scorer is None:
            raise bad_request("logprobs: this engine does not score tokens", "logprobs")
        params = None
        if asked == 0:  # nothing to generate: the prompts, echoed
            outputs = [[Completion("", [], [], prompt_tokens=len(p))] * req.n for p in prompts]
        else:
            max_tokens = limits.max_tokens(asked, 16, max(len(p) for p in prompts))
            params = sampling_params(req, max_tokens, req.logprobs is not None, stop_limits)
            if req.stream:
                check_streamable(req, params)
                events = streamed(batcher, request, prompts, params, tokenizer)
                return sse_response(events, "text_completion", served_name, req, len(prompts))
            outputs = await _generate(batcher, request, prompts, params)
        choices = await _completion_choices(
            req, given, prompts, outputs, params, tokenizer, batcher, scorer if scored else None
        )
        request.state.usage = usage = usage_of(outputs)  # the request log line reads it
        request.state.finished = [c.finish_reason for group in outputs for c in group]
        return envelope("cmpl", "text_completion", served_name, choices, usage)

    @app.post("/v1/chat/completions", dependencies=auth, response_model=None)
    async def chat(req: ChatRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        _check(req, names, request)
        messages = messages_of(req)
        check_continuation(req, messages)
        if req.top_logprobs and not req.logprobs:  # as OpenAI and vLLM refuse it
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if req.top_logprobs and scorer is None:
            raise bad_request("top_logprobs: this engine does not score tokens", "top_logprobs")
        prompt = chat_prompt(req, messages, limits)
        max_tokens = limits.max_tokens(asked_tokens(req), DEFAULT_MAX_TOKENS, len(prompt))
        params = sampling_params(req, max_tokens, req.logprobs, stop_limits)
        if req.stream:
            check_streamable(req, params)
            events = streamed(batcher, request, [prompt], params, tokenizer)
            return sse_response(events, "chat.completion.chunk", served_name, req, 1)
        outputs = await _generate(batcher, request, [prompt], params)
        choices = []
        for j, c in enumerate(outputs[0]):
            scores = None
            if req.top_logprobs:  # the likeliest tokens where each was sampled
                top = req.top_logprobs
                scores = await _scored(batcher, scorer, prompt, c, top, _sampled_at(params))
            choices.append(chat_choice(j, c, req, tokenizer, scores))
        request.state.usage = usage = usage_of(outputs)  # the request log line reads it
        request.state.finished = [c.finish_reason for c in outputs[0]]
        reply = envelope("chatcmpl", "chat.completion", served_name, choices, usage)
        if req.return_token_ids:
            reply["prompt_token_ids"] = prompt  # vLLM puts the chat prompt's ids here
        return reply

    served = [route.path for route in app.routes if isinstance(route, APIRoute)]
    metrics = ServerMetrics(served_name, served)
    app.add_middleware(RequestRecord, metrics=metrics, out=access_log)
    return app


def _sampled_at(params: SamplingParams | None) -> float:
    """The temperature a completion's tokens were sampled at (1 for greedy or none)."""
    return params.temperature if params is not None and not params.greedy else 1.0


async def _scored(
    batcher: DynamicBatcher,
    scorer: Scorer | None,
    prompt: list[int],
    c: Completion,
    top: int,
    temperature: float,
    echo: bool = False,
) -> list[TokenScore]:
    """A completion's tokens scored on the generation thread (its prompt's from the
    second token too when echoed), each with the `top` likeliest tokens in its place, the
    completion's under the temperature they were sampled at."""
    assert scorer is not None
    start = 1 if echo else len(prompt)
    ids = prompt + c.token_ids
    return await batcher.call(scorer.score, ids, top, start, len(prompt), temperature)


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
    temperature = _sampled_at(params)
    choices = []
    for i, group in enumerate(outputs):
        echoed = echoed_prompt(given[i], prompts[i], tokenizer) if req.echo else None
        for j, c in enumerate(group):
            scores = None
            if scorer is not None and req.logprobs is not None:
                scores = await _scored(
                    batcher, scorer, prompts[i], c, req.logprobs, temperature, req.echo
                )
            choice = completion_choice(i * req.n + j, c, req, tokenizer, prompts[i], echoed)
            if req.logprobs is not None:
                choice["logprobs"] = completion_logprobs(c, req, tokenizer, prompts[i], scores)
            choices.append(choice)
    return choices


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


def _auth_checker(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        if not secrets.compare_digest(token.encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key", "AuthenticationError")

    return check


def _check(req: SamplingFields, names: list[str], request: Request) -> None:
    """Refuse a model not served, a parameter not honoured, a stream option without a
    stream; the request log names the model from here on."""
    _check_model(req.model, names, request)
    for name, value in (req.model_extra or {}).items():
        if name in UNHONOURED and value not in UNHONOURED[name]:
            raise bad_request(
                f"{name} is not supported by the embedded server (only "
                f"{' or '.join(json.dumps(v) for v in UNHONOURED[name])})",
                name,
            )
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options needs stream=true", "stream_options")


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
    body = error_body(status, message, kind, param)
    return JSONResponse(status_code=status, content=body, headers=headers)


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
