"""`TransformersEngine.score`: a sequence's token log-probs and the likeliest tokens, as
one forward pass over the whole sequence gives them."""

from __future__ import annotations

import pytest
import torch

from collabrl.engines import hf

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away"


def _full_logprobs(engine, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.inference_mode():
        logits = engine.model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits / temperature, -1)


def test_scores_are_those_of_one_forward_pass(tiny_engine):
    ids = tiny_engine.encode(TEXT)
    full = _full_logprobs(tiny_engine, ids)
    scores = tiny_engine.score(ids, top=3)
    assert len(scores) == len(ids) - 1  # the first token has nothing before it
    for i, score in enumerate(scores, start=1):
        assert score.logprob == pytest.approx(full[i - 1, ids[i]].item(), abs=1e-4)
        values, best = full[i - 1].topk(3)
        assert [t for t, _ in score.top] == best.tolist()  # likeliest first
        assert [v for _, v in score.top] == pytest.approx(values.tolist(), abs=1e-4)


def test_chunks_through_the_cache_change_nothing(tiny_engine, monkeypatch):
    """A long sequence is read a chunk at a time, so that its logits never all sit in
    memory at once; the scores across chunk borders are those of one pass."""
    ids = tiny_engine.encode(TEXT)
    whole = tiny_engine.score(ids, top=2)
    monkeypatch.setattr(hf, "_SCORE_CHUNK", 4)
    chunked = tiny_engine.score(ids, top=2)
    assert [s.logprob for s in chunked] == pytest.approx([s.logprob for s in whole], abs=1e-4)
    assert [s.top[0][0] for s in chunked] == [s.top[0][0] for s in whole]


def test_a_completion_is_scored_under_its_sampling_temperature(tiny_engine):
    """From `scaled_from` on (a completion's tokens) the logits are divided by the
    temperature, as the engine reports sampled log-probs; before it (the prompt) not."""
    ids = tiny_engine.encode(TEXT)
    raw, hot = _full_logprobs(tiny_engine, ids), _full_logprobs(tiny_engine, ids, 0.5)
    scores = tiny_engine.score(ids, top=0, start=4, scaled_from=8, temperature=0.5)
    assert len(scores) == len(ids) - 4 and all(s.top == () for s in scores)
    for i, score in enumerate(scores, start=4):
        expected = (hot if i >= 8 else raw)[i - 1, ids[i]].item()
        assert score.logprob == pytest.approx(expected, abs=1e-4)


def test_a_start_outside_the_sequence_is_refused(tiny_engine):
    with pytest.raises(ValueError, match="start"):
        tiny_engine.score([1, 2, 3], top=1, start=0)
