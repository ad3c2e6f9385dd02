"""`stream=true`: a generation's text as server-sent events, token by token where the
engine decodes token by token (continuous batching), in OpenAI's chunk shape.

Text is sent only where later tokens cannot change it (`_StreamedText`), decoding runs on
a thread beside the event loop, and a client that goes away cancels its job.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from collabrl.engines.base import Completion, Prompt, SamplingParams
from collabrl.serve.batcher import DynamicBatcher, ShuttingDown
from collabrl.serve.openai_api import APIError, SamplingFields, bad_request, error_body, usage_of
from collabrl.serve.stops import StopScan, settled


def check_streamable(req: SamplingFields, params: SamplingParams) -> None:
    """What a stream does not carry is refused rather than left out."""
    for param, asked in (("logprobs", params.logprobs), ("return_token_ids", req.return_token_ids)):
        if asked:
            raise bad_request(f"{param} is not streamed by the embedded server", param)


async def streamed(
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
    request.state.usage = usage_of(outputs)
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


def sse_response(
    events: AsyncIterator[tuple[int, str, Completion | None]],
    kind: str,
    model: str,
    req: SamplingFields,
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
                yield chunk([], usage_of(groups))
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
    return f"data: {json.dumps(error_body(status, message, kind))}\n\n"
