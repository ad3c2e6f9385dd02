"""Which episodes reach a trainer: re-encoded ones are refused, empty ones skipped."""

from __future__ import annotations

import pytest

from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.errors import UserError
from collabrl.train.episodes import trainable


def _episode(end: EndReason, *segments: Segment) -> Episode:
    return Episode("p", [1, 2], list(segments), end=end)


def test_empty_episodes_are_skipped_with_a_count() -> None:
    full = _episode(EndReason.EOS, Segment(Author.POLICY, "a", [5], [-0.1]))
    empty = _episode(EndReason.EMPTY)
    result = trainable([full, empty, full])
    assert result.episodes == [full, full] and result.skipped_empty == 1


def test_reencoded_episodes_are_refused() -> None:
    reencoded = Segment(Author.POLICY, "a", [5], None, {"reencoded": True})
    with pytest.raises(UserError, match="re-encoded"):
        trainable([_episode(EndReason.EOS, reencoded)])
