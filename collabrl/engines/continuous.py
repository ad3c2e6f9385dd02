"""Continuous batching with per-row KV caches, for the transformers engine.

Rows (a prompt times its n samples) wait in a queue and up to `batch_size` of them
decode together. When a row finishes, the next waiting row takes its place at once, so
the batch stays full until the queue runs dry. A static batch instead steps its
finished rows until its longest one ends: at 512 tokens half of its row-steps produced
nothing (docs/benchmarks.md).

A row joins the batch after a prefill of its own, with no padding: on a CPU prefill is
compute bound, so batching it gains little. The prefill starts from the longest prefix of
the prompt found in the `PrefixStore`, the KV caches of earlier rows and prompts. A relay
or consult round resends every episode with a few new tokens, so each row reads only
those, and a prompt sampled n times is read once.

The batch's cache is right-aligned: every row's newest token is in the last column,
shorter rows are left-padded (masked), and one decode step appends one column for all.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, TopKLogitsWarper, TopPLogitsWarper
from transformers.cache_utils import DynamicLayer

from collabrl.engines.base import SamplingParams, TokenCallback

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Per layer, the keys and values of one sequence: [1, kv heads, tokens, head dim] each.
LayerKV = tuple[torch.Tensor, torch.Tensor]
# Columns a batch cache grows by at least when full.
GROW_MIN = 64


def supports_row_caches(model: PreTrainedModel) -> bool:
    """Whether every layer of the model's cache is a plain growing one; sliding-window
    layers drop old columns, which the right-aligned batch cache cannot express."""
    layers = DynamicCache(config=model.config).layers
    return all(type(layer) is DynamicLayer for layer in layers)


@dataclass
class Row:
    """One sequence being generated: the caller's row `index`, its prompt and output."""

    index: int
    prompt: list[int]
    generator: torch.Generator | None = None
    limit: int | None = None  # this row's most new tokens (None: the call's max_tokens)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False

    def sequence(self) -> list[int]:
        return self.prompt + self.tokens

    def tail(self, k: int) -> list[int]:
        """The last k tokens of the sequence, without copying all of it."""
        if k <= 0:
            return []
        if k <= len(self.tokens):
            return self.tokens[-k:]
        return self.prompt[max(0, len(self.prompt) - (k - len(self.tokens))) :] + self.tokens


class PrefixStore:
    """KV caches of recent sequences, keyed by their tokens; least recently used go first
    once they hold more than `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], list[LayerKV]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def put(self, tokens: list[int], kv: list[LayerKV]) -> None:
        key = tuple(tokens)
        if not key or key in self._entries:
            return
        size = _nbytes(kv)
        if size > self.max_bytes:
            return
        # An entry that is a prefix of this one serves no prompt better than it does:
        # a row's prompt goes once the row's whole sequence is in.
        for old in [old for old in self._entries if key[: len(old)] == old]:
            self._bytes -= _nbytes(self._entries.pop(old))
        self._entries[key] = kv
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= _nbytes(dropped)

    def longest(self, prompt: list[int]) -> tuple[int, list[LayerKV] | None]:
        """The cache sharing the longest prefix with `prompt`, cut to that prefix; at least
        one prompt token is always left to feed the model (its logits start the row)."""
        best, best_key = 0, None
        limit = len(prompt) - 1
        for key in self._entries:
            shared = _common_prefix(key, prompt, limit)
            if shared > best:
                best, best_key = shared, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in self._entries[best_key]]


class GrowingLayer(DynamicLayer):
    """A cache layer that appends into spare room instead of concatenating.

    transformers' `DynamicLayer` concatenates, allocating and copying the whole cache at
    every step: at batch 16 and 600 tokens a decode step took 169.8 ms with it and 143.9
    ms with this layer on a 2-core CPU (bench/decode_step.py). Here the keys and values
    are views of buffers that grow by half when full, so a step writes only its new
    column.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, used: int) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._keys, self._values = keys, values  # [batch, heads, room, head dim]
        self.used = used
        self.keys, self.values = keys[:, :, :used], values[:, :, :used]

    def update(self, key_states, value_states, *args, **kwargs):
        new = key_states.shape[2]
        if self.used + new > self._keys.shape[2]:
            self._grow(self.used + new)
        self._keys[:, :, self.used : self.used + new] = key_states
        self._values[:, :, self.used : self.used + new] = value_states
        self.used += new
        self.keys = self._keys[:, :, : self.used]
        self.values = self._values[:, :, : self.used]
        return self.keys, self.values

    def _grow(self, needed: int) -> None:
        room = max(needed, spare_room(self._keys.shape[2]))
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            grown = old.new_zeros(old.shape[0], old.shape[1], room, old.shape[3])
            grown[:, :, : self.used] = old[:, :, : self.used]
            setattr(self, name, grown)


def cache_argument(model: PreTrainedModel, cache: DynamicCache) -> dict[str, DynamicCache]:
    """The forward keyword that takes a KV cache: `cache` where the model has it
    (transformers 5.24 renamed it and warns on every step of the old name),
    `past_key_values` before. A peft model passes either through to its base model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_keyword(type(base)): cache}


@functools.cache
def _cache_keyword(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def spare_room(width: int) -> int:
    """Columns to allocate for a cache `width` wide: half as many again, at least 64 more."""
    return width + max(width // 2, GROW_MIN)


def growing_cache(layers: list[LayerKV], used: int) -> DynamicCache:
    """A cache over buffers whose first `used` columns hold the keys and values."""
    cache = DynamicCache()
    cache.layers = [GrowingLayer(keys, values, used) for keys, values in layers]
    return cache


class Batch:
    """The rows decoding together and their right-aligned KV cache.

    A finished row keeps its place until a waiting row is written over it, which copies
    only the new row's cache; the whole cache is copied only when a new row is longer
    than the batch is wide, or to drop finished rows once nothing is waiting.
    """

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.pads: list[int] = []  # left-padding columns of each row
        self.cache: DynamicCache | None = None

    @property
    def width(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    @property
    def live(self) -> int:
        return sum(not row.done for row in self.rows)

    def admit(self, rows: list[Row], caches: list[list[LayerKV]]) -> None:
        """Add rows whose caches cover all of their sequence but the newest token."""
        free = [i for i, row in enumerate(self.rows) if row.done]
        wide_rows, wide_caches = [], []
        for row, kv in zip(rows, caches, strict=True):
            if free and _length(kv) <= self.width:
                self._overwrite(free.pop(0), row, kv)
            else:
                wide_rows.append(row)
                wide_caches.append(kv)
        if wide_rows:
            self.rebuild(wide_rows, wide_caches)

    def _overwrite(self, slot: int, row: Row, kv: list[LayerKV]) -> None:
        # The finished row's old columns stay where the new row is padded: masked, and
        # finite, so they weigh exactly zero in attention.
        start = self.width - _length(kv)
        for layer, (keys, values) in zip(self.cache.layers, kv, strict=True):
            layer.keys[slot, :, start:] = keys[0]
            layer.values[slot, :, start:] = values[0]
        self.rows[slot] = row
        self.pads[slot] = start

    def rebuild(self, rows: list[Row] = (), caches: list[list[LayerKV]] = ()) -> None:
        """Copy the cache without the finished rows, plus `rows`, into fresh tensors."""
        keep = [i for i, row in enumerate(self.rows) if not row.done]
        cut = min((self.pads[i] for i in keep), default=self.width)  # padding in every row
        kept = self.width - cut
        width = max([kept, *(_length(kv) for kv in caches)])
        if width == 0:
            self.rows, self.pads, self.cache = [], [], None
            return
        merged = []
        room = spare_room(width)
        for layer in range(len(caches[0]) if caches else len(self.cache.layers)):
            parts: list[LayerKV] = []
            if keep:
                old = self.cache.layers[layer]
                index = torch.tensor(keep, device=old.keys.device)
                parts.append((old.keys[index, :, cut:], old.values[index, :, cut:]))
            parts += [kv[layer] for kv in caches]
            merged.append(tuple(_right_align([p[i] for p in parts], width, room) for i in (0, 1)))
        self.pads = [self.pads[i] - cut + width - kept for i in keep]
        self.pads += [width - _length(kv) for kv in caches]
        self.rows = [self.rows[i] for i in keep] + list(rows)
        self.cache = growing_cache(merged, width) if self.rows else None

    def row_cache(self, i: int) -> list[LayerKV]:
        """A copy of row i's cache without its padding (the batch tensors move on)."""
        pad = self.pads[i]
        return [
            (la.keys[i : i + 1, :, pad:].clone(), la.values[i : i + 1, :, pad:].clone())
            for la in self.cache.layers
        ]

    def step(self, model: PreTrainedModel) -> torch.Tensor:
        """Feed every row its newest token; the next-token logits, one row each."""
        device = model.device
        width = self.width
        ids = torch.tensor([[row.tokens[-1]] for row in self.rows], device=device)
        positions = torch.tensor([[width - pad] for pad in self.pads], device=device)
        columns = torch.arange(width + 1, device=device)
        mask = (columns[None, :] >= torch.tensor(self.pads, device=device)[:, None]).long()
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **cache_argument(model, self.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]


@dataclass
class Decoder:
    """Runs rows to completion through one model (see the module docstring)."""

    model: PreTrainedModel
    batch_size: int
    eos_ids: list[int]
    store: PrefixStore | None = None
    # Returns True once a row's text contains a stop string (None: no stop strings).
    hits_stop: Callable[[list[int]], bool] | None = None
    banned: list[list[int]] = field(default_factory=list)
    interrupt: threading.Event | None = None
    on_tokens: TokenCallback | None = None  # told each row's tokens as they grow
    cached_tokens: int = 0  # prompt tokens served from the store

    def run(self, rows: list[Row], params: SamplingParams) -> None:
        # Longest prompt first: a memory problem shows up at once, not after an hour.
        waiting = iter(sorted(rows, key=lambda r: -len(r.prompt)))
        batch = Batch()
        with torch.inference_mode():
            self._fill(batch, waiting, params)
            while batch.live:
                if self.interrupt is not None and self.interrupt.is_set():
                    return
                self._append(batch.rows, batch.step(self.model), params)
                self._store_finished(batch)
                self._fill(batch, waiting, params)
                if batch.live < len(batch.rows):  # nothing left to take their places
                    batch.rebuild()

    def _fill(self, batch: Batch, waiting: Iterator[Row], params: SamplingParams) -> None:
        """Prefill waiting rows into the free places of the batch."""
        joining: list[Row] = []
        caches: list[list[LayerKV]] = []
        while batch.live + len(joining) < self.batch_size:
            row = next(waiting, None)
            if row is None:
                break
            kv, logits = self._prefill(row.prompt)
            self._append([row], logits, params)
            if row.done:  # ended at its first token; its prompt's cache is stored
                continue
            joining.append(row)
            caches.append(kv)
        if joining:
            batch.admit(joining, caches)

    def _prefill(self, prompt: list[int]) -> tuple[list[LayerKV], torch.Tensor]:
        shared, past = (0, None) if self.store is None else self.store.longest(prompt)
        self.cached_tokens += shared
        cache = DynamicCache(ddp_cache_data=past) if past else DynamicCache()
        ids = torch.tensor([prompt[shared:]], device=self.model.device)
        out = self.model(
            input_ids=ids,
            position_ids=torch.arange(shared, len(prompt), device=ids.device)[None, :],
            **cache_argument(self.model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        kv = [(layer.keys, layer.values) for layer in cache.layers]  # filled in place
        self._keep(prompt, kv)
        return kv, out.logits[:, -1, :]

    def _keep(self, tokens: list[int], kv: list[LayerKV]) -> None:
        if self.store is not None:
            self.store.put(tokens, kv)

    def _store_finished(self, batch: Batch) -> None:
        """Keep the caches of the rows that just finished: a later call may extend them."""
        if self.store is None:
            return
        for i, row in enumerate(batch.rows):
            if row.done:
                # The newest token was never fed: the cache covers the rest.
                self.store.put(row.sequence()[:-1], batch.row_cache(i))

    def _append(self, rows: list[Row], logits: torch.Tensor, params: SamplingParams) -> None:
        """Choose each row's next token from its logits and mark the rows that end."""
        scores = logits.float()
        for i, row in enumerate(rows):
            for token in self._banned_next(row):
                scores[i, token] = float("-inf")
        if not params.greedy:
            scores = scores / params.temperature
        chosen = _choose(scores, rows, params)
        if params.logprobs:
            picked = torch.log_softmax(scores, dim=-1).gather(-1, chosen[:, None])[:, 0]
            for row, value in zip(rows, picked.tolist(), strict=True):
                row.logprobs.append(value)
        for row, token in zip(rows, chosen.tolist(), strict=True):
            row.tokens.append(token)
            row.done = (
                token in self.eos_ids
                or len(row.tokens) >= (row.limit or params.max_tokens)
                or (self.hits_stop is not None and self.hits_stop(row.tokens))
            )
            if self.on_tokens is not None:
                self.on_tokens(row.index, row.tokens)

    def _banned_next(self, row: Row) -> list[int]:
        """Tokens that would complete a banned sequence after the row's tokens so far."""
        return [seq[-1] for seq in self.banned if row.tail(len(seq) - 1) == seq[:-1]]


def _choose(scores: torch.Tensor, rows: list[Row], params: SamplingParams) -> torch.Tensor:
    """Greedy argmax, or a draw after top-k and top-p; a seeded row draws from its own
    generator, so its sample does not depend on which rows share its batch."""
    if params.greedy:
        return scores.argmax(dim=-1)
    if params.top_k > 0:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    probs = torch.softmax(scores, dim=-1)
    if all(row.generator is None for row in rows):
        return torch.multinomial(probs, 1)[:, 0]
    draws = [torch.multinomial(probs[i], 1, generator=row.generator) for i, row in enumerate(rows)]
    return torch.cat(draws)


def _right_align(parts: list[torch.Tensor], width: int, room: int) -> torch.Tensor:
    """Stack [b, h, t, d] tensors along the batch, each left-padded with zeros to `width`,
    in a buffer `room` columns wide."""
    first = parts[0]
    rows = sum(p.shape[0] for p in parts)
    out = first.new_zeros(rows, first.shape[1], room, first.shape[3])
    start = 0
    for part in parts:
        out[start : start + part.shape[0], :, width - part.shape[2] : width] = part
        start += part.shape[0]
    return out


def _common_prefix(key: tuple[int, ...], prompt: list[int], limit: int) -> int:
    n = min(len(key), limit)
    for i in range(n):
        if key[i] != prompt[i]:
            return i
    return n


def _length(kv: list[LayerKV]) -> int:
    return kv[0][0].shape[2]


def _nbytes(kv: list[LayerKV]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
