"""Continuous batching and per-row KV caches: faster paths, the same tokens.

The reference is transformers' own `generate`, one prompt at a time (no padding, no
cache reuse): under greedy decoding the continuous path must produce the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from collabrl.engines.base import SamplingParams
from collabrl.engines.continuous import Batch, GrowingLayer, PrefixStore, Row
from collabrl.engines.hf import TransformersEngine
from collabrl.models import load_model, load_tokenizer
from tests.conftest import EMBEDDED

PROMPTS = [
    "What is 2+2?",
    "Hello there, how are you today?",
    "A much longer prompt with many more tokens in it than the others, going on a while.",
    "Name three colours.",
    "Count to five, please, and then say done.",
    "x",
    "Why is the sky blue? Answer in one sentence.",
]


def _engines(model: Path | str, **kwargs) -> tuple[TransformersEngine, TransformersEngine]:
    """A continuous engine and the one-prompt-at-a-time `generate` reference, one model."""
    model, tok = load_model(str(model)), load_tokenizer(str(model))
    reference = TransformersEngine(model, tok, batch_size=1, continuous=False)
    return TransformersEngine(model, tok, **kwargs), reference


def _tokens(engine: TransformersEngine, prompts, params: SamplingParams) -> list[list[int]]:
    return [c.token_ids for group in engine.generate(prompts, params) for c in group]


def _early_eos(engine: TransformersEngine, reference: TransformersEngine) -> None:
    """Make tokens the model writes greedily its EOS, so rows end at different steps."""
    runs = _tokens(reference, PROMPTS, SamplingParams(max_tokens=24))
    ends = {run[i] for run, i in zip(runs, (3, 9, 15, 6, 20, 12, 2), strict=True)}
    for e in (engine, reference):
        e._eos_ids = sorted(ends)


def test_refilled_rows_match_one_prompt_at_a_time(tiny_model_dir: Path) -> None:
    engine, reference = _engines(tiny_model_dir, batch_size=3, prefix_cache=True)
    _early_eos(engine, reference)
    params = SamplingParams(max_tokens=24, n=2)
    got, expected = _tokens(engine, PROMPTS, params), _tokens(reference, PROMPTS, params)
    assert got == expected
    assert len({len(t) for t in got}) > 3  # rows really ended at different steps
    assert engine.cached_tokens > 0  # each prompt's second sample reused the first's cache


@pytest.mark.parametrize("continuous", [True, False])
def test_each_prompt_gets_its_own_budget_in_one_call(tiny_model_dir: Path, continuous) -> None:
    """Per-prompt `budgets` give each row what `generate` with its own max_tokens gives."""
    engine, reference = _engines(tiny_model_dir, batch_size=3, continuous=continuous)
    budgets = (1, 9, 4, 16, 2, 9, 5)
    params = SamplingParams(max_tokens=999, n=2, budgets=budgets)  # each prompt's budget rules
    got = _tokens(engine, PROMPTS, params)
    expected = [
        c.token_ids
        for prompt, budget in zip(PROMPTS, budgets, strict=True)
        for c in reference.generate([prompt], SamplingParams(max_tokens=budget, n=2))[0]
    ]
    assert got == expected
    assert [len(t) for t in got[::2]] == list(budgets)  # no early EOS: every row used its budget
    with pytest.raises(ValueError, match="budgets"):
        engine.generate(PROMPTS, SamplingParams(budgets=budgets[:-1]))


@pytest.mark.parametrize("continuous", [True, False])
def test_a_seeded_prompt_samples_the_same_with_its_budget_in_a_mixed_batch(
    tiny_model_dir: Path, continuous
) -> None:
    """A batch with mixed budgets and per-prompt seeds: each prompt gets exactly its
    budget and the text it gets alone with its seed (what the pool's merged calls need)."""
    engine, _ = _engines(tiny_model_dir, batch_size=8, continuous=continuous)
    # Distinct budgets: the static path samples each budget's rows from one stream.
    budgets, seeds = (3, 11, 6, 8), (40, 7, 19, 3)
    mixed = SamplingParams(temperature=1.0, budgets=budgets, seeds=seeds)
    got = [group[0] for group in engine.generate(PROMPTS[:4], mixed)]
    alone = [
        engine.generate([p], SamplingParams(max_tokens=b, temperature=1.0, seed=s))[0][0]
        for p, b, s in zip(PROMPTS[:4], budgets, seeds, strict=True)
    ]
    assert [c.token_ids for c in got] == [c.token_ids for c in alone]
    assert [c.text for c in got] == [c.text for c in alone]
    assert [len(c.token_ids) for c in got] == list(budgets)


def test_batched_rounds_reuse_each_rows_cache_and_keep_the_tokens(tiny_model_dir: Path) -> None:
    """A relay-style loop: every episode comes back with its output and a few new tokens."""
    engine, reference = _engines(tiny_model_dir, batch_size=4, prefix_cache=True)
    insert = engine.tokenizer(" <call>5</call> and", add_special_tokens=False)["input_ids"]
    histories = []
    for e in (engine, reference):
        ids = [e.encode([{"role": "user", "content": p}]) for p in PROMPTS[:4]]
        for _ in range(3):
            outs = _tokens(e, ids, SamplingParams(max_tokens=8))
            ids = [h + out + insert for h, out in zip(ids, outs, strict=True)]
        histories.append(ids)
    assert histories[0] == histories[1]
    # Rounds 2 and 3 read only what was appended: the rest came from the rows' caches.
    fed = sum(len(h) for h in histories[0])
    assert engine.cached_tokens > 0.6 * fed


def test_a_seeded_row_samples_the_same_whatever_its_batch(tiny_model_dir: Path) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.0, n=3, seed=11)
    alone, _ = _engines(tiny_model_dir, batch_size=1)
    together, _ = _engines(tiny_model_dir, batch_size=8)
    samples = _tokens(alone, PROMPTS, params)
    assert samples == _tokens(together, PROMPTS, params)
    assert len({tuple(s) for s in samples[:3]}) > 1  # the n samples differ


def test_logprobs_and_stops_survive_refills(tiny_model_dir: Path) -> None:
    engine, reference = _engines(tiny_model_dir, batch_size=2)
    first = reference.generate([PROMPTS[1]], SamplingParams(max_tokens=12))[0][0]
    stop = first.text.split()[-1]
    params = SamplingParams(max_tokens=12, stop=(stop,), logprobs=True)
    got = [c for group in engine.generate(PROMPTS, params) for c in group]
    expected = [c for group in reference.generate(PROMPTS, params) for c in group]
    assert [c.text for c in got] == [c.text for c in expected]
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert [c.stop_reason for c in got] == [c.stop_reason for c in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


# --- the pieces ----------------------------------------------------------------------------------


def _kv(length: int, value: float, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ones = torch.full((1, 2, length, 4), value)
    return [(ones.clone(), -ones.clone()) for _ in range(layers)]


def test_the_store_serves_the_longest_prefix_and_leaves_a_token_to_feed() -> None:
    store = PrefixStore(max_bytes=10**6)
    store.put([1, 2, 9, 9], _kv(4, 1.0))
    store.put([1, 2, 3, 4, 5], _kv(5, 2.0))
    shared, kv = store.longest([1, 2, 3, 4, 5])
    assert shared == 4 and kv[0][0].shape[2] == 4 and kv[0][0][0, 0, 0, 0] == 2.0
    assert store.longest([1, 2, 9])[0] == 2
    assert store.longest([7, 1, 2]) == (0, None)


def test_an_entry_that_another_extends_is_dropped() -> None:
    store = PrefixStore(max_bytes=10**6)
    store.put([1, 2, 3], _kv(3, 1.0))
    store.put([1, 2, 3, 4, 5], _kv(5, 2.0))  # the same row, finished
    store.put([1, 2, 7], _kv(3, 3.0))  # another branch stays
    assert len(store) == 2
    assert store.longest([1, 2, 3, 0])[1][0][0][0, 0, 0, 0] == 2.0


def test_the_store_forgets_the_least_recently_used_past_its_budget() -> None:
    one = 2 * 2 * (1 * 2 * 3 * 4) * 4  # 2 layers, keys and values, 3 tokens, float32
    store = PrefixStore(max_bytes=2 * one)
    store.put([1, 2, 3], _kv(3, 1.0))
    store.put([4, 5, 6], _kv(3, 1.0))
    store.longest([1, 2, 3, 9])  # [1, 2, 3] is now the most recently used
    store.put([7, 8, 9], _kv(3, 1.0))
    assert len(store) == 2
    assert store.longest([4, 5, 6, 0])[0] == 0 and store.longest([1, 2, 3, 0])[0] == 3


def test_the_batch_keeps_each_rows_cache_through_overwrites_and_rebuilds() -> None:
    batch = Batch()
    rows = [Row(i, [0] * n) for i, n in enumerate((3, 5))]
    for row in rows:
        row.tokens.append(0)
    batch.admit(rows, [_kv(3, 1.0), _kv(5, 2.0)])
    assert batch.width == 5 and batch.pads == [2, 0]
    rows[0].done = True
    short = Row(2, [0] * 2, tokens=[0])
    batch.admit([short], [_kv(2, 3.0)])  # fits: written over the finished row
    assert batch.rows == [short, rows[1]] and batch.pads == [3, 0]
    rows[1].done = True
    wide = Row(3, [0] * 7, tokens=[0])
    batch.admit([wide], [_kv(7, 4.0)])  # wider than the batch: copied into new tensors
    assert batch.rows == [short, wide] and batch.width == 7 and batch.pads == [5, 0]
    for i, value in enumerate((3.0, 4.0)):
        keys, values = batch.row_cache(i)[1]
        assert torch.all(keys == value) and torch.all(values == -value)
    short.done = True
    batch.rebuild()  # nothing waiting: the finished row goes, and so does its padding
    assert batch.rows == [wide] and batch.pads == [0] and batch.width == 7


# --- the real model ------------------------------------------------------------------------------


def test_smollm2_greedy_tokens_are_unchanged_by_continuous_batching() -> None:
    """The embedded model, real GSM8K-style prompts, rows refilled as others end."""
    engine, reference = _engines(EMBEDDED, batch_size=3, prefix_cache=True)
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS[:6]]
    params = SamplingParams(max_tokens=40)
    assert _tokens(engine, prompts, params) == _tokens(reference, prompts, params)


def test_a_growing_layer_keeps_its_columns_when_it_grows() -> None:
    keys, values = _kv(3, 1.0, layers=1)[0]
    room = torch.zeros(1, 2, 4, 4)
    room[:, :, :3] = keys
    layer = GrowingLayer(room, room.clone() * -1, used=3)
    for step in range(70):  # past the 4 columns of room, twice
        new = torch.full((1, 2, 1, 4), float(step))
        got_keys, got_values = layer.update(new, -new)
    assert layer.get_seq_length() == 73 and got_keys.shape == (1, 2, 73, 4)
    assert torch.all(got_keys[:, :, :3] == 1.0) and torch.all(got_values[:, :, :3] == -1.0)
    assert [got_keys[0, 0, 3 + s, 0].item() for s in range(70)] == [float(s) for s in range(70)]
