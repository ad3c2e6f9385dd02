"""The embedded OpenAI-compatible server (FastAPI) for machines without a GPU.

Endpoints: `/health`, `/v1/models`, `/v1/completions`, `/v1/chat/completions`.
Sampling fields follow the OpenAI API plus vLLM's extensions that the toolkit
sends (`top_k`, `include_stop_str_in_output`, `bad_words`, `chat_template_kwargs`,
`return_token_ids`, `return_tokens_as_token_ids`), answered in vLLM's shape.
Streaming is not offered: the toolkit's clients never stream.

Prompts are encoded here, before they are queued, so that what the model cannot
take is refused at once with a 400 in OpenAI's error shape: text that is not valid
Unicode, a prompt longer than the model's context (a 1 MB prompt once held the
server for eleven minutes), `max_tokens` beyond what the context leaves, a seed
outside 64 bits (vLLM's bound), a message whose role no chat template knows. A request
whose client disconnects is dropped from the queue before it is generated.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from collabrl.engines.base import (
    Completion,
    Prompt,
    SamplingParams,
    continues_assistant,
    encode_prompt,
)
from collabrl.serve.batcher import DynamicBatcher, ShuttingDown

DEFAULT_MAX_TOKENS = 1024  # when a chat request names none (OpenAI's default is "until the end")
# vLLM's bounds on `seed`: a 64-bit signed integer (torch's seeds), checked before queueing;
# 2**70 reached the generator and came back a 500.
SEED_RANGE = (-(2**63), 2**63 - 1)
# The roles a chat template knows (OpenAI's, less the deprecated "function"). vLLM passes
# any role to the template, which renders an unknown one as a turn of nobody; here it is
# a 400, so that a client's typo is not read as a prompt.
ChatRole = Literal["system", "developer", "user", "assistant", "tool"]
TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids


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


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown OpenAI fields are accepted, as vLLM does

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
    prompt: str | list[str] | list[int]
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: ChatRole
    content: str | list[dict[str, Any]]


class ChatRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    # vLLM's extensions for continuing a partial assistant reply (a relay teacher).
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    # vLLM's: options for the chat template, e.g. {"enable_thinking": false} (Qwen3).
    chat_template_kwargs: dict[str, Any] | None = None


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
        vocab = len(self.tokenizer)
        if any(not 0 <= i < vocab for i in ids):
            raise _bad_request(f"token ids must be in 0..{vocab - 1} (the vocabulary)", param)
        if self.context is not None and len(ids) >= self.context:
            raise _bad_request(
                f"This model's maximum context length is {self.context} tokens; the prompt "
                f"has {len(ids)} tokens and at least one must be left to generate",
                param,
            )
        return ids

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
    tokenizer = limits.tokenizer

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return _error(err.status, err.message, err.kind, err.param)

    @app.exception_handler(ShuttingDown)
    async def _shutting_down(_: Request, err: ShuttingDown) -> JSONResponse:
        return _error(503, str(err), "ServiceUnavailableError")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        # OpenAI and vLLM answer 400 (not FastAPI's 422) to a malformed request.
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', err)}" if where else str(first.get("msg", err))
        return _error(400, f"invalid request: {message}", "BadRequestError", where or None)

    @app.exception_handler(Exception)
    async def _internal(_: Request, err: Exception) -> JSONResponse:
        # Starlette still logs the traceback on the server; the client gets one line.
        return _error(500, f"internal error: {type(err).__name__}: {err}", "InternalServerError")

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
    async def completions(req: CompletionRequest, request: Request) -> dict[str, Any]:
        _check(req, names)
        prompts = [limits.encode(p, None, "prompt") for p in _prompts_of(req.prompt)]
        longest = max(len(p) for p in prompts)
        params = _params(req, limits.max_tokens(_asked(req), 16, longest), req.logprobs is not None)
        outputs = await _generate(batcher, request, prompts, params)
        choices = [
            _completion_choice(i * params.n + j, c, req, tokenizer, prompts[i])
            for i, group in enumerate(outputs)
            for j, c in enumerate(group)
        ]
        return _envelope("cmpl", "text_completion", served_name, choices, outputs)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat(req: ChatRequest, request: Request) -> dict[str, Any]:
        _check(req, names)
        messages = [{"role": m.role, "content": _text_of(m.content)} for m in req.messages]
        _check_continuation(req, messages)
        prompt = limits.encode(messages, req.chat_template_kwargs, "messages")
        max_tokens = limits.max_tokens(_asked(req), DEFAULT_MAX_TOKENS, len(prompt))
        params = _params(req, max_tokens, req.logprobs)
        outputs = await _generate(batcher, request, [prompt], params)
        choices = [_chat_choice(j, c, req, tokenizer) for j, c in enumerate(outputs[0])]
        reply = _envelope("chatcmpl", "chat.completion", served_name, choices, outputs)
        if req.return_token_ids:
            reply["prompt_token_ids"] = prompt  # vLLM puts the chat prompt's ids here
        return reply

    return app


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


def _check(req: _SamplingFields, names: set[str]) -> None:
    if req.model not in names:
        raise APIError(
            404, f"model '{req.model}' does not exist; served: {sorted(names)}", "NotFoundError"
        )
    if req.stream:
        raise _bad_request("streaming is not supported by the embedded server", "stream")


def _check_continuation(req: ChatRequest, messages: list[dict[str, str]]) -> None:
    """The engines continue a final assistant message; say so rather than guess."""
    if req.continue_final_message != continues_assistant(messages):
        raise _bad_request(
            "continue_final_message=true needs a final assistant message, and a final "
            "assistant message needs continue_final_message=true",
            "continue_final_message",
        )


def _prompts_of(prompt: str | list[str] | list[int]) -> list[Prompt]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise _bad_request("prompt is empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # one prompt given as token ids
    return list(prompt)  # a batch of text prompts


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _asked(req: _SamplingFields) -> int | None:
    return req.max_completion_tokens or req.max_tokens


def _params(req: _SamplingFields, max_tokens: int, logprobs: bool) -> SamplingParams:
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
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


def _token_texts(c: Completion, req: _SamplingFields, tokenizer: Any) -> list[str]:
    """The log-prob entries' tokens: their text, or vLLM's "token_id:N" when asked."""
    if req.return_tokens_as_token_ids:
        return [f"{TOKEN_ID_PREFIX}{i}" for i in c.token_ids]
    return [tokenizer.decode([i]) for i in c.token_ids]


def _completion_choice(
    index: int, c: Completion, req: CompletionRequest, tokenizer: Any, prompt: list[int]
) -> dict[str, Any]:
    logprobs = None
    if req.logprobs is not None and c.logprobs is not None:
        logprobs = {
            "tokens": _token_texts(c, req, tokenizer),
            "token_logprobs": c.logprobs,
            "top_logprobs": None,
            "text_offset": None,
        }
    choice = {
        "index": index,
        "text": c.text,
        "logprobs": logprobs,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
    }
    if req.return_token_ids:
        # As vLLM: every sampled id, the EOS that ended the completion included.
        choice.update(token_ids=c.token_ids, prompt_token_ids=prompt)
    return choice


def _chat_choice(index: int, c: Completion, req: ChatRequest, tokenizer: Any) -> dict[str, Any]:
    logprobs = None
    if req.logprobs and c.logprobs is not None:
        content = [
            {"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": []}
            for token, lp in zip(_token_texts(c, req, tokenizer), c.logprobs, strict=True)
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


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={
            "error": {"message": _printable(message), "type": kind, "param": param, "code": status}
        },
    )
