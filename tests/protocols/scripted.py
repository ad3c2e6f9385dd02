"""Deterministic engines for protocol-logic tests.

`ScriptedEngine` is a real Engine whose "model" is a list of replies: it encodes
each reply with the real tokenizer and honours stop strings, `include_stop` and
`max_tokens` the way the transformers engine does, so a protocol cannot tell it
from a model that happens to write those words. `RecordingEngine` wraps any engine
and keeps every prompt it was sent (to check token-id continuity).
"""

from __future__ import annotations

from collections.abc import Callable

from collabrl.engines.base import Completion, Prompt, SamplingParams, cut_at_stop, encode_prompt


class ScriptedEngine:
    name = "scripted"

    def __init__(self, tokenizer, replies: list[str] | Callable[[Prompt], str]) -> None:
        self.tokenizer = tokenizer
        self._replies = replies
        self.prompts: list[Prompt] = []

    def _next(self, prompt: Prompt) -> str:
        if callable(self._replies):
            return self._replies(prompt)
        return self._replies.pop(0) if self._replies else ""

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        self.prompts.extend(prompts)
        return [[self._complete(p, params)] for p in prompts for _ in range(params.n)]

    def _complete(self, prompt: Prompt, params: SamplingParams) -> Completion:
        reply = self._next(prompt)
        _, stop = cut_at_stop(reply, params.stop, params.include_stop)
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        finish = "stop"
        if stop is None:
            ids = ids + [self.tokenizer.eos_token_id]  # the reply ends: the model's EOS
        else:
            # Like a real model, the ids end at the token that completes the stop string,
            # and that token may carry more characters (`</call>.` ends in `>.`).
            ids = ids[: self._tokens_to(ids, stop)]
        if len(ids) > params.max_tokens:
            ids, finish, stop = ids[: params.max_tokens], "length", None
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        prompt_tokens = len(encode_prompt(self.tokenizer, prompt))
        return Completion(text, ids, None, finish, stop, prompt_tokens)

    def _tokens_to(self, ids: list[int], stop: str) -> int:
        """The fewest leading ids whose text contains `stop`."""
        return next(k for k in range(1, len(ids) + 1) if stop in self.tokenizer.decode(ids[:k]))

    def close(self) -> None:
        pass


class RecordingEngine:
    """Delegates to `inner` and records every prompt it receives."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = f"recording:{inner.name}"
        self.tokenizer = inner.tokenizer
        self.prompts: list[Prompt] = []

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        self.prompts.extend(prompts)
        return self.inner.generate(prompts, params)

    def close(self) -> None:
        pass
