"""The stream's stop-string check: the same cut as the whole-text check, at a cost that does
not grow with the text; and the limits on what a request may ask for."""

from __future__ import annotations

import random
import re

import pytest

from collabrl.engines.base import cut_at_stop
from collabrl.serve.stops import StopLimits, StopScan, _shared_prefix, settled


def _naive_settled(text: str, stops: tuple[str, ...]) -> str:
    """The check as it was: every prefix of every stop string against the text's end."""
    text = re.sub(r"[\s\ufffd]+$", "", text)
    held = max(
        (k for stop in stops for k in range(1, len(stop)) if text.endswith(stop[:k])),
        default=0,
    )
    return text[: len(text) - held]


def _texts(rng: random.Random, steps: int) -> list[str]:
    """A stream's texts: each the last with a few characters at its end rewritten (as a
    decoder rewrites half a character or a space) and a few added."""
    texts, text = [], ""
    for _ in range(steps):
        text = text[: max(0, len(text) - rng.randint(0, 3))]
        text += "".join(rng.choice("ab a\ufffd\n") for _ in range(rng.randint(0, 5)))
        texts.append(text)
    return texts


@pytest.mark.parametrize("seed", range(40))
def test_the_incremental_check_cuts_where_the_whole_text_check_does(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        stops = tuple(
            "".join(rng.choice("ab ") for _ in range(rng.randint(1, 5)))
            for _ in range(rng.randint(1, 4))
        )
        include = rng.random() < 0.5
        scan = StopScan(stops, include)
        for text in _texts(rng, 40):
            assert scan.cut(text) == cut_at_stop(text, stops, include), (stops, text)
            assert settled(text, stops) == _naive_settled(text, stops), (stops, text)


def test_shared_prefix_on_random_pairs() -> None:
    rng = random.Random(0)
    for _ in range(3000):
        a = "".join(rng.choice("ab") for _ in range(rng.randint(0, 40)))
        tail = "".join(rng.choice("ab") for _ in range(rng.randint(0, 9)))
        b = a[: rng.randint(0, len(a))] + tail
        shared = min(len(a), len(b))
        expected = next((i for i in range(shared) if a[i] != b[i]), shared)
        assert _shared_prefix(a, b) == _shared_prefix(b, a) == expected, (a, b)


def test_limits_refuse_too_many_too_long_and_empty_stop_strings() -> None:
    limits = StopLimits(count=4, length=8)
    limits.check(("a" * 8,) * 4)  # at the limits
    with pytest.raises(ValueError, match=r"at most 4 stop strings .* got 5 .*max_stop_strings"):
        limits.check(("a",) * 5)
    with pytest.raises(ValueError, match=r"at most 8 characters, got one of 9 .*max_stop_length"):
        limits.check(("a" * 9,))
    with pytest.raises(ValueError, match="cannot be empty"):
        limits.check(("a", ""))
