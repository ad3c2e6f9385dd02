"""Print an Episode as a transcript, each segment coloured by its author.

What a model wrote reaches the terminal only through `shown`: an ESC sequence, NUL or
bidi override (RLO) in a policy's text, an answer or a tool's output would otherwise
clear the screen, retitle the window or reorder what the reader sees, and an invisible
character (a zero-width space, a tag character) would hide text from the reader.
"""

from __future__ import annotations

import json
import re

from rich.console import Console
from rich.table import Table
from rich.text import Text

from collabrl.episode import HELPERS, Author, Episode
from collabrl.tools.base import UNPRINTABLE

# What a terminal shows as nothing, or as a line break no text has: zero-width spaces,
# joiners and marks (U+200B-U+200F, U+2060-U+2064, U+FEFF), the line and paragraph
# separators (U+2028, U+2029), bidi embeddings, overrides and isolates (U+202A-U+202E,
# U+2066-U+2069), and the tag characters (U+E0000-U+E007F), which spell ASCII unseen.
INVISIBLE = re.compile(
    "[\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f]"
)
# Every character a transcript writes as its escape: the controls as well.
_ESCAPED = re.compile(f"{UNPRINTABLE.pattern}|{INVISIBLE.pattern}")

STYLES = {
    Author.POLICY: "default",
    Author.TEACHER: "bold green",
    Author.EXPERT: "bold cyan",
    Author.GUIDANCE: "bold magenta",
    Author.TOOL: "yellow",
    Author.ENVIRONMENT: "dim",
}


def shown(text: str) -> str:
    """`text` with each control, bidi, invisible or surrogate character written as its
    escape (`\\x1b`, `\\u200b`, `\\U000e0041`): the reader sees that the text held one."""
    return _ESCAPED.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def json_line(data: object) -> str:
    """`data` as one JSON line, safe on a terminal: what JSON leaves raw and a terminal
    acts on or hides (DEL and C1 controls, bidi and invisible characters, lone
    surrogates, which no stream can encode) written as `\\uXXXX` escapes (a surrogate
    pair past U+FFFF), which read back as the same characters."""
    text = json.dumps(data, ensure_ascii=False)  # π and 答 stay readable
    return _ESCAPED.sub(lambda m: json.dumps(m.group())[1:-1], text)


def transcript(episode: Episode) -> Text:
    text = Text()
    for segment in episode.segments:
        text.append(shown(segment.shown_text), style=STYLES[segment.author])
    return text


def legend() -> Text:
    text = Text("authors: ")
    for author, style in STYLES.items():
        text.append(f"{author} ", style=style)
    return text


def print_episode(console: Console, episode: Episode, seconds: float | None = None) -> None:
    console.print(legend())
    title = f"{episode.meta.get('protocol', '')} · {episode.problem_id}"
    console.rule(Text(shown(title)))  # a Text: the id's brackets are not markup
    console.print(transcript(episode), highlight=False)
    console.rule()
    summary = Table.grid(padding=(0, 2))
    rows = [
        ("answer", str(episode.answer)),
        ("tokens", _tokens(episode)),
        ("calls", f"{len(episode.calls)} ({_failures(episode)} unavailable)"),
        (
            "call ratio",
            f"{episode.call_ratio_realised():.3f} realised · "
            f"{episode.call_ratio_requested():.3f} requested",
        ),
        ("turns", str(episode.turns)),
        ("end", str(episode.end)),
    ]
    if seconds is not None:
        rows.append(("time", f"{seconds:.2f} s"))
    if episode.tool_calls:
        rows.append(("tool calls", f"{len(episode.tool_calls)} ({episode.tool_errors} failed)"))
    if "strategies" in episode.meta:
        rows.append(("strategies", ", ".join(episode.meta["strategies"])))
    for key, value in rows:
        summary.add_row(Text(key, style="bold"), Text(shown(value)))
    console.print(summary)


def _tokens(episode: Episode) -> str:
    parts = [f"{len(episode.response_ids)} response"]
    for author in (Author.POLICY, *sorted(HELPERS), Author.GUIDANCE, Author.ENVIRONMENT):
        count = episode.tokens_by(author)
        if count:
            parts.append(f"{count} {author}")
    return " · ".join(parts)


def _failures(episode: Episode) -> int:
    return sum(s.meta.get("outcome") == "unavailable" for s in episode.calls)
