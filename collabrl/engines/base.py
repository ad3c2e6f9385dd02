"""The one small interface every text generator implements.

A prompt is either raw text (already formatted), a list of chat messages (the
engine applies its own chat template), or a list of token ids in the engine's
tokenizer. Chat messages that end with an assistant message ask for that message
to be *continued* (vLLM's `continue_final_message`): this is how a teacher is
handed a partial answer in its own chat template.

`generate` returns, for every prompt, `params.n` completions. What may differ from
prompt to prompt of one batch travels in the params: each prompt's seed (`seeds`) and
its most new tokens (`budgets`). A caller with one params per prompt (the expert
pool's calls) groups them by `batch_key` and merges each group with
`SamplingParams.merge`; `for_prompt` gives one prompt's params back.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ChatMessage = dict[str, str]
Prompt = str | list[ChatMessage] | list[int]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch. `temperature == 0` means greedy decoding."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k cut
    n: int = 1
    seed: int | None = None
    # Each prompt's own seed, in prompt order; empty: prompt i gets `seed + i`. A server
    # and vLLM seed every request on its own, so one seed shared by the samples of a
    # problem would make them the same text.
    seeds: tuple[int, ...] = ()
    # Each prompt's own most new tokens, in prompt order; empty: every prompt gets
    # `max_tokens`. A relay round's teacher calls each ask for their own n, and are
    # still one batch.
    budgets: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    include_stop: bool = False  # keep the matched stop string at the end of the text
    banned: tuple[str, ...] = ()  # strings the model may never produce
    logprobs: bool = False  # return the sampling log-prob of every generated token

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(budget < 1 for budget in self.budgets):
            raise ValueError(f"budgets must all be >= 1, got {self.budgets}")

    @classmethod
    def of(cls, config: Any, **changes: Any) -> SamplingParams:
        """The params of a `SamplingConfig` (its n is the caller's: samples per problem
        are units of work, each sampled once); `changes` override any field (a training
        run's seed is its own config's)."""
        fields = {
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": config.top_k,
            # A training run's `DecodingConfig` has none: its seed is the run's (`changes`).
            "seed": getattr(config, "seed", None),
        }
        return cls(**{**fields, **changes})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def prompt_seed(self, index: int) -> int | None:
        """The seed of prompt `index` of a batch: its own (`seeds`), else `seed + index`."""
        if self.seeds:
            return self.seeds[index]
        return None if self.seed is None else self.seed + index

    def prompt_budget(self, index: int) -> int:
        """The most new tokens of prompt `index` of a batch: its own (`budgets`), else
        `max_tokens`."""
        if self.budgets:
            return self.budgets[index]
        return self.max_tokens

    def with_budgets(self, budgets: Sequence[int]) -> SamplingParams:
        """These params with prompt i's most new tokens `budgets[i]`: `max_tokens` the
        largest, `budgets` kept only where they differ (a uniform batch stays one shape)."""
        if not budgets:
            raise ValueError("with_budgets: one budget per prompt, got none")
        uniform = len(set(budgets)) == 1
        return dataclasses.replace(
            self, max_tokens=max(budgets), budgets=() if uniform else tuple(budgets)
        )

    def check_seeds(self, prompts: int) -> None:
        """Refuse per-prompt seeds that do not match the batch (a caller's bug)."""
        if self.seeds and len(self.seeds) != prompts:
            raise ValueError(f"seeds: one per prompt, got {len(self.seeds)} for {prompts}")

    def check_budgets(self, prompts: int) -> None:
        """Refuse per-prompt budgets that do not match the batch (a caller's bug)."""
        if self.budgets and len(self.budgets) != prompts:
            raise ValueError(f"budgets: one per prompt, got {len(self.budgets)} for {prompts}")

    @property
    def seeded(self) -> bool:
        """Whether the prompts draw from seeded random streams."""
        return self.seed is not None or bool(self.seeds)

    def for_prompt(self, index: int) -> SamplingParams:
        """The params of prompt `index` of a batch on its own: its seed as `seed`, its
        budget as `max_tokens`, nothing per prompt left (a request to a server)."""
        return dataclasses.replace(
            self,
            max_tokens=self.prompt_budget(index),
            seed=self.prompt_seed(index),
            seeds=(),
            budgets=(),
        )

    def batch_key(self) -> Hashable:
        """What the params of calls must share for the calls to be one batch: every
        field but the token budget and the seed; whether there is a seed counts."""
        shared = tuple(
            (f.name, getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in _PER_PROMPT
        )
        return (*shared, ("seeded", self.seeded))

    @classmethod
    def merge(cls, calls: Sequence[SamplingParams]) -> SamplingParams:
        """One batch's params from the params of one-prompt calls that share a
        `batch_key`, each call keeping its own seed and budget: `budgets` only where the
        budgets differ (`max_tokens` is then the largest), `seeds` when seeded."""
        if not calls:
            raise ValueError("merge: no params to merge")
        first = calls[0]
        key = first.batch_key()
        for params in calls:
            params.check_seeds(1)
            params.check_budgets(1)
            if params.batch_key() != key:
                raise ValueError("merge: the params differ in more than budget and seed")
        seeds = tuple(params.prompt_seed(0) for params in calls) if first.seeded else ()
        merged = dataclasses.replace(first, seed=seeds[0] if seeds else None, seeds=seeds)
        return merged.with_budgets([params.prompt_budget(0) for params in calls])


# The fields a batch's prompts may each have their own of (see `batch_key`).
_PER_PROMPT = frozenset({"max_tokens", "seed", "seeds", "budgets"})


@dataclass
class Completion:
    """One generated continuation."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    finish_reason: str = "length"  # "stop" (EOS or a stop string) or "length"
    stop_reason: str | None = None  # the stop string that ended it, if any
    prompt_tokens: int = 0
    # The server's count of generated tokens, for answers that carry no token ids (HTTP).
    reported_tokens: int | None = None

    @property
    def completion_tokens(self) -> int:
        if self.token_ids or self.reported_tokens is None:
            return len(self.token_ids)
        return self.reported_tokens


@runtime_checkable
class Engine(Protocol):
    """Text generation over a batch of prompts."""

    name: str

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """Return `params.n` completions for every prompt, in prompt order."""
        ...

    def close(self) -> None:
        """Release the engine's resources (processes, connections, GPU memory)."""
        ...


@runtime_checkable
class Interruptible(Protocol):
    """An engine whose generation can be stopped from another thread (a server that
    shuts down): within `interruptible(event)`, setting `event` ends it at the next token."""

    def interruptible(self, event: threading.Event) -> AbstractContextManager[None]: ...


# Called with a row's index (prompt-major, `n` rows per prompt) and its tokens so far.
TokenCallback = Callable[[int, list[int]], None]


@runtime_checkable
class Streaming(Protocol):
    """An engine that reports tokens as they are decoded (a server streaming its answer):
    within `streaming(on_tokens)`, every new token of a row calls `on_tokens` from the
    generating thread."""

    def streaming(self, on_tokens: TokenCallback) -> AbstractContextManager[None]: ...


def encode_prompt(
    tokenizer, prompt: Prompt, chat_template_kwargs: Mapping[str, Any] | None = None
) -> list[int]:
    """Token ids of a prompt for a Hugging Face tokenizer.

    Chat messages get the tokenizer's chat template, rendered with
    `chat_template_kwargs` (e.g. `enable_thinking=False`; `add_generation_prompt=False`
    leaves out the assistant header, as vLLM's request field of that name does); text
    is taken as already formatted (special tokens included), so no BOS is added on top.
    """
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if prompt and isinstance(prompt[0], dict):
        options = dict(chat_template_kwargs or {})
        continuing = continues_assistant(prompt)
        header = bool(options.pop("add_generation_prompt", True)) and not continuing
        return tokenizer.apply_chat_template(
            prompt,
            add_generation_prompt=header,
            continue_final_message=continuing,
            tokenize=True,
            return_dict=False,
            **options,
        )
    return list(prompt)  # already token ids


def continues_assistant(messages: list[ChatMessage]) -> bool:
    """True when the last message is a partial assistant reply to be continued."""
    return bool(messages) and messages[-1].get("role") == "assistant"


def cut_at_stop(text: str, stops: tuple[str, ...], include_stop: bool) -> tuple[str, str | None]:
    """Cut `text` at the earliest stop string; return the kept text and the stop hit."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    if best is None:
        return text, None
    pos, stop = best
    return (text[: pos + len(stop)] if include_stop else text[:pos]), stop
