"""Batched generation with transformers' `generate` — the CPU default.

Prompts are expanded `n` times, sorted by length (less padding), cut into
batches of `batch_size`, left-padded and generated together. Each row is then
trimmed to what the model really produced: up to its EOS, or up to the token
that completed a stop string.

The engine may share its model with a trainer: a seeded call leaves torch's global
random state as it found it, and the prefix KV cache is dropped when the weights
change (an optimizer step), or on `reset()`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from transformers import StoppingCriteria, StoppingCriteriaList

from collabrl.engines.base import (
    Completion,
    Prompt,
    SamplingParams,
    cut_at_stop,
    encode_prompt,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# transformers' model_max_length when the tokenizer does not know it (int(1e30)).
_UNSET_LENGTH = 10**12
# Where every parameter's storage is and how often it was modified in place.
WeightsFingerprint = tuple[tuple[int, int], ...]


class TransformersEngine:
    """Engine over an in-memory transformers causal LM."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 16,
        name: str = "transformers",
        prefix_cache: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.name = name
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._eos_ids = _eos_token_ids(model, tokenizer)
        # The last one-row sequence and its KV cache: a protocol that resumes one episode
        # (relay, consult) sends that sequence plus a few new tokens, and re-reading the
        # whole prefix would cost more than decoding on a CPU (measured in bench/). The
        # weights' fingerprint it was computed with comes along: after an optimizer step
        # the cache is stale.
        self.prefix_cache = prefix_cache
        self._cached: tuple[WeightsFingerprint, list[int], Any] | None = None
        self.cached_tokens = 0  # prompt tokens served from the cache, for tests and benches
        self._interrupt: threading.Event | None = None  # see `interruptible`

    @classmethod
    def from_ref(
        cls,
        ref: str,
        batch_size: int = 16,
        dtype: str = "float32",
        device: str = "cpu",
        prefix_cache: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> TransformersEngine:
        """Load a model reference (see `collabrl.models`) into an engine."""
        from collabrl.models import load_model, load_tokenizer, resolve_model

        model_ref = resolve_model(ref)
        model = load_model(model_ref, dtype=dtype, device=device)
        tokenizer = load_tokenizer(model_ref)
        return cls(model, tokenizer, batch_size, ref, prefix_cache, chat_template_kwargs)

    # -- prompts -----------------------------------------------------------------

    def encode(self, prompt: Prompt) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template_kwargs)

    @property
    def context_length(self) -> int | None:
        """Most tokens (prompt and completion) the model can attend to, when known.

        The model config's `max_position_embeddings` and the tokenizer's
        `model_max_length` may each be missing or the "unknown" sentinel (transformers puts
        1e30 where the tokenizer does not know); the smaller real one wins.
        """
        limits = [
            getattr(self.model.config, "max_position_embeddings", None),
            getattr(self.tokenizer, "model_max_length", None),
        ]
        real = [n for n in limits if isinstance(n, int) and 0 < n < _UNSET_LENGTH]
        return min(real, default=None)

    # -- state ---------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the prefix KV cache (call after changing the weights out of place)."""
        self._cached = None

    @contextlib.contextmanager
    def interruptible(self, event: threading.Event) -> Iterator[None]:
        """Within this block, a generation stops at its next token once `event` is set
        (a server shutting down: nobody waits for the rows any more)."""
        self._interrupt = event
        try:
            yield
        finally:
            self._interrupt = None

    # -- generation --------------------------------------------------------------

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        encoded = [self.encode(p) for p in prompts]
        rows = [(i, ids) for i, ids in enumerate(encoded) for _ in range(params.n)]
        # Longest first: similar lengths share a batch, and a memory problem shows
        # up in the first batch rather than after an hour.
        order = sorted(range(len(rows)), key=lambda r: -len(rows[r][1]))
        results: list[Completion | None] = [None] * len(rows)
        for batch_no, batch in enumerate(_chunks(order, self.batch_size)):
            seed = None if params.seed is None else params.seed + batch_no
            outputs = self._generate_batch([rows[r][1] for r in batch], params, seed)
            for r, completion in zip(batch, outputs, strict=True):
                results[r] = completion
        grouped: list[list[Completion]] = [[] for _ in prompts]
        for (prompt_index, _), completion in zip(rows, results, strict=True):
            assert completion is not None
            grouped[prompt_index].append(completion)
        return grouped

    def _generate_batch(
        self, batch: list[list[int]], params: SamplingParams, seed: int | None
    ) -> list[Completion]:
        import torch

        input_ids, attention_mask = self._left_pad(batch)
        weights = _fingerprint(self.model) if self.prefix_cache and len(batch) == 1 else None
        reuse = self._reusable_cache(batch, weights)
        with torch.inference_mode(), _seeded(seed, self.model.device):
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                tokenizer=self.tokenizer,  # needed by stop_strings
                return_dict_in_generate=True,
                output_logits=params.logprobs,
                stopping_criteria=self._stopping_criteria(),
                **reuse,
                **self._generation_kwargs(params),
            )
        if weights is not None:
            self._cached = (weights, out.sequences[0].tolist(), out.past_key_values)
        new_tokens = out.sequences[:, input_ids.shape[1] :].tolist()
        logprobs = _sampled_logprobs(out, input_ids.shape[1], params) if params.logprobs else None
        rows_logprobs = logprobs or [None] * len(batch)
        return [
            self._finish_row(tokens, row_logprobs, params, len(prompt))
            for tokens, row_logprobs, prompt in zip(new_tokens, rows_logprobs, batch, strict=True)
        ]

    def _reusable_cache(
        self, batch: list[list[int]], weights: WeightsFingerprint | None
    ) -> dict[str, Any]:
        """`past_key_values` covering the longest prefix this one-row prompt shares with
        the previous one-row sequence, computed with the same weights; empty when there is
        nothing to reuse."""
        cached, self._cached = self._cached, None  # generate extends the cache in place
        if weights is None or cached is None or cached[0] != weights:
            return {}
        _, previous, cache = cached
        prompt = batch[0]
        # At least one prompt token must be left to feed the model; the cache holds every
        # token of the previous sequence but its last (never fed back in).
        limit = min(len(prompt) - 1, cache.get_seq_length())
        shared = next(
            (i for i, (a, b) in enumerate(zip(prompt[:limit], previous, strict=False)) if a != b),
            min(limit, len(previous)),
        )
        if shared == 0:
            return {}
        if shared < cache.get_seq_length():
            cache.crop(shared - cache.get_seq_length())  # negative: tokens to drop at the end
        self.cached_tokens += shared
        return {"past_key_values": cache}

    def _stopping_criteria(self) -> StoppingCriteriaList:
        event = self._interrupt
        return StoppingCriteriaList([_Interrupted(event)] if event is not None else [])

    def _left_pad(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(ids) for ids in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        device = self.model.device
        return input_ids.to(device), mask.to(device)

    def _generation_kwargs(self, params: SamplingParams) -> dict:
        kwargs: dict = {
            "max_new_tokens": params.max_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self._eos_ids,
            "do_sample": not params.greedy,
        }
        if params.greedy:
            # Neutral values: the model's generation_config may carry its own
            # sampling defaults, which would otherwise trigger warnings.
            kwargs.update(temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else None,
            )
        if params.stop:
            kwargs["stop_strings"] = list(params.stop)
        if params.banned:
            kwargs["bad_words_ids"] = self._banned_ids(params.banned)
        return kwargs

    def _banned_ids(self, banned: tuple[str, ...]) -> list[list[int]]:
        # A string can be tokenized differently after a space, so ban both forms.
        forms = {form for text in banned for form in (text, " " + text)}
        ids = [self.tokenizer(form, add_special_tokens=False)["input_ids"] for form in forms]
        return [seq for seq in ids if seq]

    def _finish_row(
        self,
        tokens: list[int],
        logprobs: list[float] | None,
        params: SamplingParams,
        prompt_tokens: int,
    ) -> Completion:
        end = next((i + 1 for i, t in enumerate(tokens) if t in self._eos_ids), None)
        finish = "stop" if end is not None else "length"
        tokens = tokens[:end] if end is not None else tokens
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        stop_reason = None
        if params.stop:
            cut_text, stop_reason = cut_at_stop(text, params.stop, params.include_stop)
            if stop_reason is not None:
                # Rows that finished early are padded (pad may equal EOS), so
                # keep only the tokens up to the one that completed the stop.
                tokens = tokens[: self._prefix_containing(tokens, stop_reason)]
                text, finish = cut_text, "stop"
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)]
        return Completion(text, tokens, logprobs, finish, stop_reason, prompt_tokens)

    def _prefix_containing(self, tokens: list[int], needle: str) -> int:
        """Smallest k such that the decode of tokens[:k] contains `needle`."""
        lo, hi = 1, len(tokens)
        while lo < hi:
            mid = (lo + hi) // 2
            if needle in self.tokenizer.decode(tokens[:mid], skip_special_tokens=True):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _sampled_logprobs(out, prompt_len: int, params: SamplingParams) -> list[list[float]]:
    """Log-prob of each generated token under the distribution it was sampled from."""
    import torch

    logits = torch.stack(out.logits, dim=1).float()  # [batch, steps, vocab]
    if not params.greedy:
        logits = logits / params.temperature
    chosen = out.sequences[:, prompt_len : prompt_len + logits.shape[1]]
    picked = torch.log_softmax(logits, dim=-1).gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    return picked.tolist()


def _fingerprint(model: PreTrainedModel) -> WeightsFingerprint:
    """Changes whenever a weight does: an optimizer step or `load_state_dict` modifies
    parameters in place, which bumps their version counters, and replacing a parameter's
    data moves its storage. About 1 ms for SmolLM2-135M's 272 tensors (walking the
    modules dominates), against tens of ms for the one-row generate it guards. Writes
    through `param.data` bypass the counters: call `reset()` after those."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed the sampling without touching the caller's random stream (a trainer's):
    torch's global generators are saved before and restored after the call."""
    if seed is None:
        yield
        return
    import torch

    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


class _Interrupted(StoppingCriteria):
    """Ends every row once `flag` is set (see `TransformersEngine.interruptible`)."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any):
        import torch

        stop = self.flag.is_set()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
