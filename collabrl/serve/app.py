"""The embedded OpenAI-compatible server (FastAPI) for machines without a GPU.

Endpoints: `/health`, `/v1/models`, `/v1/completions`, `/v1/chat/completions`.
Sampling fields follow the OpenAI API plus vLLM's extensions that the toolkit
sends (`top_k`, `include_stop_str_in_output`, `bad_words`). Streaming is not
offered: the toolkit's clients never stream.
"""

from __future__ import annotations

import secrets
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from collabrl.engines.base import Completion, SamplingParams, continues_assistant
from collabrl.serve.batcher import DynamicBatcher

DEFAULT_MAX_TOKENS = 1024  # when a chat request names none (OpenAI's default is "until the end")


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown OpenAI fields are accepted, as vLLM does

    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    n: int = Field(1, ge=1, le=128)
    seed: int | None = None
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    bad_words: list[str] | None = None
    stream: bool = False


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int]
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]]


class ChatRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    # vLLM's extensions for continuing a partial assistant reply (a relay teacher).
    continue_final_message: bool = False
    add_generation_prompt: bool = True


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def create_app(
    batcher: DynamicBatcher, served_name: str, api_key: str | None, aliases: tuple[str, ...] = ()
) -> FastAPI:
    """The FastAPI app around a started-on-startup `DynamicBatcher`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="collabrl embedded server", lifespan=lifespan)
    names = {served_name, *aliases}
    auth = [Depends(_auth_checker(api_key))]

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return _error(err.status, err.message, err.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        # OpenAI and vLLM answer 400 (not FastAPI's 422) to a malformed request.
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"invalid request: {where}: {first.get('msg', err)}", "BadRequestError")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=auth)
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": served_name, "object": "model", "created": 0, "owned_by": "collabrl"}],
        }

    @app.post("/v1/completions", dependencies=auth)
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        _check(req, names)
        prompts = _prompts_of(req.prompt)
        params = _params(req, default_max_tokens=16, logprobs=req.logprobs is not None)
        outputs = await batcher.submit(prompts, params)
        choices = [
            _completion_choice(i * params.n + j, c, params)
            for i, group in enumerate(outputs)
            for j, c in enumerate(group)
        ]
        return _envelope("cmpl", "text_completion", served_name, choices, outputs)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat(req: ChatRequest) -> dict[str, Any]:
        _check(req, names)
        messages = [{"role": m.role, "content": _text_of(m.content)} for m in req.messages]
        _check_continuation(req, messages)
        params = _params(req, default_max_tokens=DEFAULT_MAX_TOKENS, logprobs=req.logprobs)
        outputs = await batcher.submit([messages], params)
        choices = [_chat_choice(j, c, params) for j, c in enumerate(outputs[0])]
        return _envelope("chatcmpl", "chat.completion", served_name, choices, outputs)

    return app


def _auth_checker(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        if not secrets.compare_digest(token.encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key", "AuthenticationError")

    return check


def _check(req: _SamplingFields, names: set[str]) -> None:
    if req.model not in names:
        raise APIError(
            404, f"model '{req.model}' does not exist; served: {sorted(names)}", "NotFoundError"
        )
    if req.stream:
        raise APIError(400, "streaming is not supported by the embedded server", "BadRequestError")


def _check_continuation(req: ChatRequest, messages: list[dict[str, str]]) -> None:
    """The engines continue a final assistant message; say so rather than guess."""
    if req.continue_final_message != continues_assistant(messages):
        raise APIError(
            400,
            "continue_final_message=true needs a final assistant message, and a final "
            "assistant message needs continue_final_message=true",
            "BadRequestError",
        )


def _prompts_of(prompt: str | list[str] | list[int]) -> list:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt is empty", "BadRequestError")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # one prompt given as token ids
    return list(prompt)  # a batch of text prompts


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _params(req: _SamplingFields, default_max_tokens: int, logprobs: bool) -> SamplingParams:
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    try:
        return SamplingParams(
            max_tokens=req.max_completion_tokens or req.max_tokens or default_max_tokens,
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
        raise APIError(400, str(err), "BadRequestError") from err


def _completion_choice(index: int, c: Completion, params: SamplingParams) -> dict[str, Any]:
    logprobs = None
    if params.logprobs and c.logprobs is not None:
        logprobs = {
            "tokens": None,
            "token_logprobs": c.logprobs,
            "top_logprobs": None,
            "text_offset": None,
        }
    return {
        "index": index,
        "text": c.text,
        "logprobs": logprobs,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }


def _chat_choice(index: int, c: Completion, params: SamplingParams) -> dict[str, Any]:
    logprobs = None
    if params.logprobs and c.logprobs is not None:
        content = [
            {"token": "", "logprob": lp, "bytes": None, "top_logprobs": []} for lp in c.logprobs
        ]
        logprobs = {"content": content}
    return {
        "index": index,
        "message": {"role": "assistant", "content": c.text},
        "logprobs": logprobs,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }


def _envelope(prefix: str, kind: str, model: str, choices: list, outputs: list) -> dict[str, Any]:
    # Every sample of a prompt saw the same prompt: count it once per prompt.
    prompt_tokens = sum(group[0].prompt_tokens for group in outputs if group)
    completion_tokens = sum(c.completion_tokens for group in outputs for c in group)
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "param": None, "code": status}},
    )
