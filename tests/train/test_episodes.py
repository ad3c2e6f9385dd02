"""Which episodes reach a trainer: re-encoded ones are refused, empty ones counted."""

from __future__ import annotations

import pytest

from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.errors import UserError
from collabrl.train.episodes import check_trainable


def _episode(end: EndReason, *segments: Segment) -> Episode:
    return Episode("p", [1, 2], list(segments), end=end)


def test_the_share_of_empty_episodes_is_counted() -> None:
    full = _episode(EndReason.EOS, Segment(Author.POLICY, "a", [5], [-0.1]))
    empty = _episode(EndReason.EMPTY)
    assert check_trainable([full, empty, full, empty]) == 0.5
    assert check_trainable([]) == 0.0


def test_reencoded_episodes_are_refused() -> None:
    reencoded = Segment(Author.POLICY, "a", [5], None, {"reencoded": True})
    with pytest.raises(UserError, match="re-encoded"):
        check_trainable([_episode(EndReason.EOS, reencoded)])
