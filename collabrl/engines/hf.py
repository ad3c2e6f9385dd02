"""Batched generation over an in-memory transformers model — the CPU default.

Prompts are expanded `n` times into rows. By default the rows go through continuous
batching with per-row KV caches (`continuous.py`): a finished row's place goes to the
next waiting row, and each row is prefilled from the longest cached prefix of its
prompt. Models whose cache has sliding-window layers, and `continuous=False`, take the
static path instead: rows sorted by length, cut into batches of `batch_size`,
left-padded and run through transformers' `generate`. Either way each row is then
trimmed to what the model really produced: up to its EOS, or up to the token that
completed a stop string.

The engine may share its model with a trainer: a seeded call leaves torch's global
random state as it found it, and the prefix caches are dropped when the weights change
(an optimizer step), or on `reset()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from transformers import DynamicCache, StoppingCriteria, StoppingCriteriaList

from collabrl.config import EngineConfig
from collabrl.engines.base import (
    Completion,
    Prompt,
    SamplingParams,
    TokenCallback,
    cut_at_stop,
    encode_prompt,
)
from collabrl.engines.continuous import (
    Decoder,
    PrefixStore,
    Row,
    cache_argument,
    supports_row_caches,
)
from collabrl.errors import UserError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# transformers' model_max_length when the tokenizer does not know it (int(1e30)).
_UNSET_LENGTH = 10**12
# Tokens per forward pass when scoring a sequence: bounds the logits held at once to
# this many rows of the vocabulary (a 8k-token prompt's at once took 1.6 GB).
_SCORE_CHUNK = 512
# Where every parameter's storage is and how often it was modified in place.
WeightsFingerprint = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class TokenScore:
    """A token's log-prob given the tokens before it, and the likeliest tokens there."""

    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log-prob), likeliest first


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
        prefix_cache_mb: int = EngineConfig.prefix_cache_mb,
        continuous: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.name = name
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._eos_ids = _eos_token_ids(model, tokenizer)
        self.continuous = continuous and supports_row_caches(model)
        # KV caches of earlier sequences: a protocol that resumes its episodes (relay,
        # consult) sends each one back with a few new tokens, and re-reading the whole
        # prefix would cost more than decoding on a CPU (measured in bench/). They are
        # only valid for the weights that computed them: after an optimizer step they go.
        self.prefix_cache = prefix_cache and self.continuous
        self._store = PrefixStore(prefix_cache_mb * 2**20)
        self._store_weights: WeightsFingerprint | None = None
        self.cached_tokens = 0  # prompt tokens served from the cache, for tests and benches
        self._interrupt: threading.Event | None = None  # see `interruptible`
        self._on_tokens: TokenCallback | None = None  # see `streaming`

    @classmethod
    def from_ref(
        cls,
        ref: str,
        batch_size: int = 16,
        dtype: str = EngineConfig.dtype,
        device: str = EngineConfig.device,
        prefix_cache: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        prefix_cache_mb: int = EngineConfig.prefix_cache_mb,
        continuous: bool = True,
    ) -> TransformersEngine:
        """Load a model reference (see `collabrl.models`) into an engine; `dtype` and
        `device` may be `auto` (`collabrl.devices`)."""
        from collabrl.models import load_model, load_tokenizer, resolve_model

        model_ref = resolve_model(ref)
        model = load_model(model_ref, dtype=dtype, device=device)
        tokenizer = load_tokenizer(model_ref)
        return cls(
            model,
            tokenizer,
            batch_size,
            ref,
            prefix_cache,
            chat_template_kwargs,
            prefix_cache_mb,
            continuous,
        )

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
        """Forget the prefix KV caches (call after changing the weights out of place)."""
        self._store.clear()

    @contextlib.contextmanager
    def interruptible(self, event: threading.Event) -> Iterator[None]:
        """Within this block, a generation stops at its next token once `event` is set
        (a server shutting down: nobody waits for the rows any more)."""
        self._interrupt = event
        try:
            yield
        finally:
            self._interrupt = None

    @contextlib.contextmanager
    def streaming(self, on_tokens: TokenCallback) -> Iterator[None]:
        """Within this block, each new token of a row calls `on_tokens(row, tokens)` (a
        server streaming its answer). Only continuous batching decodes token by token
        here; `generate`'s static batches report nothing until they end."""
        self._on_tokens = on_tokens
        try:
            yield
        finally:
            self._on_tokens = None

    # -- generation --------------------------------------------------------------

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions of every prompt, each with the prompt's own seed and
        most new tokens (`params.prompt_seed`, `params.prompt_budget`).

        Prompts with different budgets share one batch: a relay round asks the teacher
        for a different n in each call, and one batch for all of them took 4.4 s where
        one batch per n, run one after another, took 9.7 s (the 9 calls of a GRPO
        rollout; docs/benchmarks.md)."""
        params.check_seeds(len(prompts))
        params.check_budgets(len(prompts))
        encoded = [self.encode(p) for p in prompts]
        self._check_context(encoded)
        rows = [(i, ids) for i, ids in enumerate(encoded) for _ in range(params.n)]
        row_prompts = [ids for _, ids in rows]
        # From here on a row is a prompt: each row with its own seed and budget.
        budgets = self._row_budgets(params, rows)
        params = dataclasses.replace(
            params, seeds=_row_seeds(params, len(prompts)), budgets=budgets
        )
        if self.continuous:
            results = self._generate_continuous(row_prompts, params)
        else:
            results = _by_budget(self._generate_static, row_prompts, params)
        grouped: list[list[Completion]] = [[] for _ in prompts]
        for (prompt_index, _), completion in zip(rows, results, strict=True):
            grouped[prompt_index].append(completion)
        return grouped

    def _check_context(self, encoded: list[list[int]]) -> None:
        """Refuse a prompt that leaves the model no room to answer, as vLLM does (a
        position past the context is an index error in some models, nonsense in others)."""
        context = self.context_length
        longest = max(map(len, encoded), default=0)
        if context is not None and longest >= context:
            raise UserError(
                f"a prompt of {longest} tokens does not fit the model's context "
                f"of {context} tokens",
                "shorten the problem or the prompt template",
            )

    def _row_budgets(
        self, params: SamplingParams, rows: list[tuple[int, list[int]]]
    ) -> tuple[int, ...]:
        """Each row's most new tokens: its prompt's budget, cut to what the context leaves
        (the completion then ends as `length`, as vLLM ends it); () when all are
        `max_tokens`."""
        context = self.context_length or _UNSET_LENGTH
        budgets = tuple(min(params.prompt_budget(i), context - len(ids)) for i, ids in rows)
        return budgets if any(b != params.max_tokens for b in budgets) else ()

    def _generate_continuous(self, prompts: list[list[int]], params: SamplingParams):
        rows = [
            Row(i, ids, self._generator(params.prompt_seed(i)), params.prompt_budget(i))
            for i, ids in enumerate(prompts)
        ]
        decoder = Decoder(
            self.model,
            self.batch_size,
            self._eos_ids,
            store=self._valid_store(),
            hits_stop=self._stop_check(params.stop) if params.stop else None,
            banned=self._banned_ids(params.banned) if params.banned else [],
            interrupt=self._interrupt,
            on_tokens=self._on_tokens,
        )
        decoder.run(rows, params)
        self.cached_tokens += decoder.cached_tokens
        return [
            self._finish_row(
                row.tokens, row.logprobs if params.logprobs else None, params, len(row.prompt)
            )
            for row in rows
        ]

    def _generator(self, seed: int | None) -> torch.Generator | None:
        """A row's own random stream when seeded: its draws depend on nothing else."""
        if seed is None:
            return None
        import torch

        return torch.Generator(device=self.model.device).manual_seed(seed)

    def _valid_store(self) -> PrefixStore | None:
        """The prefix store, emptied first if the weights changed since it was filled."""
        if not self.prefix_cache:
            return None
        weights = _fingerprint(self.model)
        if weights != self._store_weights:
            self._store.clear()
            self._store_weights = weights
        return self._store

    def _stop_check(self, stops: tuple[str, ...]):
        """Whether a row's newest tokens contain a stop string; decoding only a window of
        them keeps the check's cost flat in the row's length."""
        window = 2 * max(len(stop) for stop in stops) + 4

        def hits(tokens: list[int]) -> bool:
            text = self.tokenizer.decode(tokens[-window:], skip_special_tokens=True)
            return any(stop in text for stop in stops)

        return hits

    def _generate_static(self, prompts: list[list[int]], params: SamplingParams):
        # Longest first: similar lengths share a batch, and a memory problem shows
        # up in the first batch rather than after an hour.
        order = sorted(range(len(prompts)), key=lambda r: -len(prompts[r]))
        results: list[Completion | None] = [None] * len(prompts)
        for batch in _chunks(order, self.batch_size):
            # One stream per static batch (`generate` samples all its rows from one),
            # seeded by its first row's seed.
            seed = params.prompt_seed(batch[0]) if params.seeds else None
            outputs = self._generate_batch([prompts[r] for r in batch], params, seed)
            for r, completion in zip(batch, outputs, strict=True):
                results[r] = completion
        return results

    def _generate_batch(
        self, batch: list[list[int]], params: SamplingParams, seed: int | None
    ) -> list[Completion]:
        import torch

        input_ids, attention_mask = self._left_pad(batch)
        with torch.inference_mode(), _seeded(seed, self.model.device):
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                tokenizer=self.tokenizer,  # needed by stop_strings
                return_dict_in_generate=True,
                output_logits=params.logprobs,
                stopping_criteria=self._stopping_criteria(),
                **self._generation_kwargs(params),
            )
        new_tokens = out.sequences[:, input_ids.shape[1] :].tolist()
        logprobs = _sampled_logprobs(out, input_ids.shape[1], params) if params.logprobs else None
        rows_logprobs = logprobs or [None] * len(batch)
        return [
            self._finish_row(tokens, row_logprobs, params, len(prompt))
            for tokens, row_logprobs, prompt in zip(new_tokens, rows_logprobs, batch, strict=True)
        ]

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

    # -- scoring -----------------------------------------------------------------

    def score(
        self,
        ids: list[int],
        top: int,
        start: int = 1,
        scaled_from: int | None = None,
        temperature: float = 1.0,
    ) -> list[TokenScore]:
        """`ids[i]`'s log-prob given `ids[:i]`, with the `top` likeliest tokens in its
        place, for each i from `start` on (a prompt's log-probs: an OpenAI `echo`).

        From position `scaled_from` on the logits are divided by `temperature` first: a
        completion's tokens under the distribution they were sampled from, as `generate`
        reports their log-probs. The sequence is read in chunks through the KV cache."""
        import torch

        if not 1 <= start <= len(ids):
            raise ValueError(f"start must be in 1..{len(ids)}, got {start}")
        scaled_from = len(ids) if scaled_from is None else scaled_from
        scores: list[TokenScore] = []
        cache = DynamicCache()  # filled in place, chunk after chunk
        with torch.inference_mode():
            for first in range(0, len(ids) - 1, _SCORE_CHUNK):
                chunk = ids[first : first + _SCORE_CHUNK]
                # Row j predicts ids[first + j + 1]; rows before `start` are only read, so
                # their logits are not computed (the vocabulary's projection is a good
                # share of a small model's work).
                targets = range(max(first + 1, start), min(first + 1 + len(chunk), len(ids)))
                wanted = len(chunk) - (targets.start - first - 1)
                inputs = torch.tensor([chunk], device=self.model.device)
                positions = torch.arange(first, first + len(chunk), device=inputs.device)
                out = self.model(
                    input_ids=inputs,
                    position_ids=positions[None, :],
                    **cache_argument(self.model, cache),
                    use_cache=True,
                    logits_to_keep=wanted if targets else 1,  # 0 would keep them all
                )
                if targets:
                    rows = out.logits[0, : len(targets)]  # the last row predicts past the end
                    scores += _token_scores(
                        rows.float(), ids, targets, scaled_from, temperature, top
                    )
        return scores

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]


def _token_scores(
    logits: torch.Tensor,
    ids: list[int],
    targets: range,
    scaled_from: int,
    temperature: float,
    top: int,
) -> list[TokenScore]:
    """The scores of `ids[targets]` from the logits that predict them (one row each)."""
    import torch

    scale = torch.tensor([temperature if i >= scaled_from else 1.0 for i in targets])
    logprobs = torch.log_softmax(logits / scale.to(logits.device)[:, None], dim=-1)
    wanted = torch.tensor([ids[i] for i in targets], device=logits.device)
    picked = logprobs.gather(-1, wanted[:, None])[:, 0].tolist()
    best_values, best_ids = logprobs.topk(top, dim=-1) if top else (logprobs[:, :0],) * 2
    return [
        TokenScore(value, tuple(zip(row_ids, row_values, strict=True)))
        for value, row_ids, row_values in zip(
            picked, best_ids.tolist(), best_values.tolist(), strict=True
        )
    ]


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


def _by_budget(
    generate: Callable[[list[list[int]], SamplingParams], list[Completion]],
    prompts: list[list[int]],
    params: SamplingParams,
) -> list[Completion]:
    """`generate` once per distinct budget of `params.budgets` (as its `max_tokens`),
    results in prompt order: transformers' `generate` takes one max length per call."""
    if not params.budgets:
        return generate(prompts, params)
    results: list[Completion | None] = [None] * len(prompts)
    for budget in sorted(set(params.budgets)):
        picked = [j for j, b in enumerate(params.budgets) if b == budget]
        # Each prompt keeps its own seed in the sub-batch.
        seeds = tuple(params.prompt_seed(j) for j in picked) if params.seeded else ()
        alike = dataclasses.replace(params, max_tokens=budget, budgets=(), seeds=seeds)
        for j, out in zip(picked, generate([prompts[j] for j in picked], alike), strict=True):
            results[j] = out
    return results  # type: ignore[return-value]  # every index was picked once


def _row_seeds(params: SamplingParams, prompts: int) -> tuple[int, ...]:
    """Each row's seed (a prompt's n samples are rows): sample j of prompt i draws with
    the prompt's own seed + j, or `seed + i·n + j` when prompts have no seeds of their own."""
    n = params.n
    if params.seeds:
        return tuple(params.seeds[i] + j for i in range(prompts) for j in range(n))
    if params.seed is None:
        return ()
    return tuple(params.seed + i * n + j for i in range(prompts) for j in range(n))
