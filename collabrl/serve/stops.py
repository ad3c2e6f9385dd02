"""Stop strings of a streamed answer: their limits, and a check that looks at new text only.

A stream is checked for its stop strings at every token. Checked naively (every stop
string against the whole text, and every prefix of every stop string against its end),
the cost grew with the number of stop strings times their length squared: one request
with long stop strings held the event loop, and with it every client, for seconds per
token. So a request may name at most `StopLimits.count` stop strings of at most
`StopLimits.length` characters (OpenAI's API takes 4), and `StopScan` examines only the
text that changed since the last token plus the longest stop string's length before it.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a stream holds back at the end of its text besides a stop string's start: whitespace
# (str.isspace, as regex `\s`; every such character is in the Basic Multilingual Plane) and
# U+FFFD, half a UTF-8 character decoded. One `rstrip` of these: a regex `[\s\ufffd]+$`
# backtracks, quadratic in a long run of spaces.
_UNSETTLED = "".join(c for c in map(chr, range(0x10000)) if c.isspace()) + "\ufffd"


@dataclass(frozen=True)
class StopLimits:
    """The most stop strings one request may name, and the most characters of each."""

    count: int = 4
    length: int = 512

    def check(self, stops: tuple[str, ...]) -> None:
        """Raise ValueError, in words a client can act on, for stop strings over the limits."""
        if len(stops) > self.count:
            raise ValueError(
                f"stop: at most {self.count} stop strings are accepted, got {len(stops)} "
                "(the server's max_stop_strings)"
            )
        longest = max(map(len, stops), default=0)
        if longest > self.length:
            raise ValueError(
                f"stop: a stop string may have at most {self.length} characters, got one "
                f"of {longest} (the server's max_stop_length)"
            )
        if any(not stop for stop in stops):
            # As vLLM: an empty string would stop every answer before its first character.
            raise ValueError("stop: a stop string cannot be empty")


class StopScan:
    """`cut_at_stop` over a text that grows token by token, finding the same cut.

    Each call is given the whole text decoded so far. Only its end may differ from the
    previous call's (a decoder rewrites half a character, or a space, once the next token
    comes); the part both share was searched already and held no stop string, so a stop
    string can only be found where it ends past that part: the search starts the longest
    stop string's length, less one, before the change. Stop strings must not be empty
    (`StopLimits.check`)."""

    def __init__(self, stops: tuple[str, ...], include_stop: bool) -> None:
        self.stops, self.include_stop = stops, include_stop
        self.reach = max(map(len, stops), default=1) - 1
        self.seen = ""  # the text of the previous call
        self.clean = 0  # how much of `seen` is known to hold no whole stop string

    def cut(self, text: str) -> tuple[str, str | None]:
        """The text up to its earliest stop string (kept when `include_stop`), and that
        stop string; the text itself and None when it holds none."""
        clean = min(self.clean, _shared_prefix(self.seen, text))
        start = max(0, clean - self.reach)
        best: tuple[int, str] | None = None
        for stop in self.stops:
            pos = text.find(stop, start)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, stop)
        self.seen = text
        if best is None:
            self.clean = len(text)
            return text, None
        pos, stop = best
        self.clean = pos  # nothing before the earliest stop string is one
        return (text[: pos + len(stop)] if self.include_stop else text[:pos]), stop


def settled(text: str, stops: tuple[str, ...]) -> str:
    """`text` less what the next tokens may still change: trailing whitespace and U+FFFD,
    then the longest end of it that begins a stop string (cut if the stop completes)."""
    text = text.rstrip(_UNSETTLED)
    held = max((_held(text, stop) for stop in stops), default=0)
    return text[: len(text) - held]


def _held(text: str, stop: str) -> int:
    """The longest k < len(stop) such that `text` ends with stop[:k]; 0 when none.

    Only a k where stop[k - 1] is the text's last character and stop[0] is the text's
    k-th from the end can be one: those few are compared, longest first, rather than
    every k (the text's last character is, for most stop strings, in none)."""
    if not text:
        return 0
    last = text[-1]
    j = stop.rfind(last, 0, min(len(stop) - 1, len(text)))  # k - 1
    while j >= 0:
        if text[-j - 1] == stop[0] and text.endswith(stop[: j + 1]):
            return j + 1
        j = stop.rfind(last, 0, j)
    return 0


def _shared_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b`.

    Two texts of one stream differ at their ends only, so the steps back from the shorter
    one's end double until the texts agree, then a binary search finds where they part:
    a few C-speed comparisons, not a loop over characters."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    step, hi = 1, n  # a[:hi] != b[:hi]
    while hi - step > 0 and a[: hi - step] != b[: hi - step]:
        hi -= step
        step *= 2
    lo = max(0, hi - step)  # a[:lo] == b[:lo]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
