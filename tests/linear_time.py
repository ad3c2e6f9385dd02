"""A timing check for parsers that read hostile text: a crafted input must cost about
what an ordinary input of the same length costs, not quadratically more."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType

# A linear parser stays within a few times the benign cost; a quadratic one on 64k
# characters is thousands of times slower.
MAX_RATIO = 5.0
# A regex stuck backtracking is stopped here (sre checks for signals), so a failing
# test fails in seconds instead of hanging for hours on a cubic pattern.
DEADLINE_S = 2.0


class _Overrun(Exception):
    pass


def _raise_overrun(signum: int, frame: FrameType | None) -> None:
    raise _Overrun


def best_time(parse: Callable[[str], object], text: str, repeats: int = 5) -> float:
    """The fastest of `repeats` runs (the least disturbed by other load), in seconds;
    fails the test when one run passes DEADLINE_S. Main thread only (SIGALRM)."""
    previous = signal.signal(signal.SIGALRM, _raise_overrun)
    best = float("inf")
    try:
        for _ in range(repeats):
            signal.setitimer(signal.ITIMER_REAL, DEADLINE_S)
            start = time.perf_counter()
            parse(text)
            best = min(best, time.perf_counter() - start)
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Overrun:
        raise AssertionError(f"{len(text)} characters took over {DEADLINE_S} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return best


def assert_linear(parse: Callable[[str], object], hostile: str, benign: str) -> None:
    """`hostile` costs at most MAX_RATIO times what `benign`, of the same length, does."""
    assert len(hostile) == len(benign), (len(hostile), len(benign))
    benign_s, hostile_s = best_time(parse, benign), best_time(parse, hostile)
    ratio = hostile_s / max(benign_s, 1e-6)
    assert ratio < MAX_RATIO, f"hostile {hostile_s:.4f} s vs benign {benign_s:.4f} s"
