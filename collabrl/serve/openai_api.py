"""The OpenAI API as the embedded server speaks it: the request bodies, the parameters it
refuses rather than drop, its error and the response bodies.

Sampling fields follow the OpenAI API plus vLLM's extensions that the toolkit sends
(`top_k`, `include_stop_str_in_output`, `bad_words`, `chat_template_kwargs`,
`return_token_ids`, `return_tokens_as_token_ids`), answered in vLLM's shape. A body is
refused as it is parsed (a 400) for what no model could take: text that is not valid
Unicode, a seed outside 64 bits (vLLM's bound), a message whose role no chat template
knows; a parameter this server cannot honour (`logit_bias`, `response_format`, ...) is a
400 naming it (`UNHONOURED`), never dropped without a word.

Only the wire format lives here: what a request is turned into (prompt ids, sampling
params) is `serve/inputs.py`, its streaming `serve/streaming.py`, the routes `serve/app.py`.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from collabrl.engines.base import Completion, Prompt

if TYPE_CHECKING:
    from collabrl.engines.hf import TokenScore

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
    "tools": (None, []),  # chat requests take them (see `inputs.chat_prompt`)
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
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
        where = f"{path}.{printable(str(key))}" if path else printable(str(key))
        found = _lone_surrogate(key, where) or _lone_surrogate(item, where)
        if found is not None:
            return found
    return None


def printable(text: str) -> str:
    """`text` with what UTF-8 cannot encode escaped, so that an error message can carry it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class SamplingFields(BaseModel):
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


class CompletionRequest(SamplingFields):
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


class ChatFields(BaseModel):
    """How messages become a prompt: the chat endpoint's, and /tokenize's chat form."""

    messages: list[ChatMessage] = Field(min_length=1)
    # Rendered by the chat template when it knows them (see `inputs.chat_prompt`); tool calls
    # come back as the model's text: there is no tool-call parser.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # vLLM's extensions for continuing a partial assistant reply (a relay teacher).
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    # vLLM's: options for the chat template, e.g. {"enable_thinking": false} (Qwen3).
    chat_template_kwargs: dict[str, Any] | None = None


class ChatRequest(SamplingFields, ChatFields):
    logprobs: bool = False
    # The likeliest tokens at each place beside the sampled one (OpenAI's; needs logprobs).
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class TokenizeText(BaseModel):
    """vLLM's /tokenize of a text."""

    model_config = ConfigDict(extra="forbid")  # a chat field here is a mistyped request

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True  # vLLM's default: a BOS where the tokenizer adds one
    return_token_strs: bool = False


class TokenizeChat(ChatFields):
    """vLLM's /tokenize of chat messages, rendered as /v1/chat/completions renders them."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    add_special_tokens: bool = False  # the chat template writes them
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


class APIError(Exception):
    """A request refused or failed: answered with `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "BadRequestError", param)


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict:
    """An error as OpenAI writes it: `{"error": {...}}`, the message printable."""
    error = {"message": printable(message), "type": kind, "param": param, "code": status}
    return {"error": error}


def _token_texts(ids: list[int], req: SamplingFields, tokenizer: Any) -> list[str]:
    """The log-prob entries' tokens: their text, or vLLM's "token_id:N" when asked."""
    if req.return_tokens_as_token_ids:
        return [f"{TOKEN_ID_PREFIX}{i}" for i in ids]
    return [tokenizer.decode([i]) for i in ids]


def echoed_prompt(given: Prompt, ids: list[int], tokenizer: Any) -> str:
    """The prompt's text before an echoed completion: as sent, or its ids decoded."""
    return given if isinstance(given, str) else tokenizer.decode(ids)


def completion_choice(
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


def completion_logprobs(
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
    score: TokenScore | None, token: int, value: float, req: SamplingFields, tokenizer: Any
) -> dict[str, float]:
    """The likeliest tokens at a place with their log-probs, and the token there with
    its own, written last so that it wins where two ids share a text."""
    top = [*(score.top if score is not None else ()), (token, value)]
    texts = _token_texts([i for i, _ in top], req, tokenizer)
    return dict(zip(texts, (lp for _, lp in top), strict=True))


def chat_choice(
    index: int,
    c: Completion,
    req: ChatRequest,
    tokenizer: Any,
    scores: list[TokenScore] | None = None,
) -> dict[str, Any]:
    """A chat choice; with `logprobs`, each sampled token's log-prob and, from `scores`
    (the completion's tokens scored as sampled), the `top_logprobs` likeliest there."""
    logprobs = None
    if req.logprobs and c.logprobs is not None:
        tokens = _token_texts(c.token_ids, req, tokenizer)
        content = [
            {
                "token": token,
                "logprob": lp,
                "bytes": list(token.encode()),
                "top_logprobs": _chat_top(scores[k] if scores else None, req, tokenizer),
            }
            for k, (token, lp) in enumerate(zip(tokens, c.logprobs, strict=True))
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


def _chat_top(score: TokenScore | None, req: ChatRequest, tokenizer: Any) -> list[dict[str, Any]]:
    """The chat format's `top_logprobs` at one place: the likeliest tokens, likeliest first."""
    top = score.top if score is not None else ()
    texts = _token_texts([i for i, _ in top], req, tokenizer)
    return [
        {"token": text, "logprob": lp, "bytes": list(text.encode())}
        for text, (_, lp) in zip(texts, top, strict=True)
    ]


def envelope(
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


def usage_of(outputs: list[list[Completion]]) -> dict[str, int]:
    # Every sample of a prompt saw the same prompt: count it once per prompt.
    prompt_tokens = sum(group[0].prompt_tokens for group in outputs if group)
    completion_tokens = sum(c.completion_tokens for group in outputs for c in group)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
