"""Transcripts on a terminal: what a model wrote is shown, never obeyed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from collabrl.episode import Author, Episode, Segment
from collabrl.train.run import ROLLOUTS
from tests.cli.test_cli import collab

# Each would act on a terminal: set its title (OSC ... BEL), clear it, blink, reverse the
# line (RLO), end a C string (NUL), return to the line's start (CR).
HOSTILE = "\x1b]0;owned\x07 \x1b[2J\x1b[5m \u202eevil\x00 back\r"


def test_control_bytes_a_model_wrote_are_escaped_in_the_transcript(tmp_path: Path) -> None:
    episode = Episode("p[1]", prompt_ids=[1])
    episode.add(Segment(Author.POLICY, f"I think {HOSTILE}\n", [2, 3]))
    episode.add(Segment(Author.TOOL, f"out {HOSTILE}\n", [4]))
    episode.add(Segment(Author.EXPERT, "", [], meta={"error": HOSTILE}))
    episode.answer = HOSTILE
    shown = _rollouts_shown(episode, tmp_path)
    for raw in ("\x1b", "\x07", "\x00", "\u202e", "\r"):
        assert raw not in shown.stdout
    escaped = r"\x1b]0;owned\x07 \x1b[2J\x1b[5m \u202eevil\x00 back\r"
    # In the policy's and the tool's text, the helper's error and the answer.
    assert shown.stdout.count(escaped) == 4, shown.stdout
    assert "p[1]" in shown.stdout  # the id is not read as markup


def test_json_output_reads_back_the_same_and_leaves_no_control_raw() -> None:
    from collabrl.cli.transcript import json_line

    data = {"text": f"π ≈ 3 {HOSTILE} \x85 \ud800", "n": 1}
    line = json_line(data)
    assert json.loads(line) == data
    assert "π" in line and not any(c in line for c in "\x1b\x07\x00\r\x85\u202e\ud800")


# Shown as nothing (or as a line break no text has) on a terminal, so text can hide in
# them: zero-width space, joiners and marks, word joiner and invisible operators, BOM,
# line and paragraph separators, bidi embeddings and isolates, and "secret" spelt in tag
# characters, which some models read and no reader sees.
INVISIBLE = (
    "\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff"
    "\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    + "".join(chr(0xE0000 + ord(c)) for c in "secret")
    + "\U000e0000\U000e007f"
)


def test_invisible_characters_a_model_wrote_are_escaped_in_the_transcript(
    tmp_path: Path,
) -> None:
    episode = Episode("p1", prompt_ids=[1])
    episode.add(Segment(Author.POLICY, f"pay{INVISIBLE}me\n", [2]))
    episode.add(Segment(Author.TOOL, f"out{INVISIBLE}\n", [3]))
    episode.answer = f"4{INVISIBLE}2"
    shown = _rollouts_shown(episode, tmp_path)
    assert not set(INVISIBLE) & set(shown.stdout)
    escaped = INVISIBLE.encode("unicode_escape").decode()
    assert r"\u200b\u200c" in escaped and r"\U000e0073\U000e0065" in escaped
    # In the policy's and the tool's text (wrapped at the terminal's width), and the
    # answer (cut to the summary's width).
    flat = shown.stdout.replace("\n", "")
    assert flat.count(escaped) == 2 and r"4\u200b\u200c" in flat, shown.stdout


def test_json_output_escapes_invisible_characters_and_reads_back_the_same() -> None:
    from collabrl.cli.transcript import json_line

    data = {"text": f"a{INVISIBLE}b", "答": INVISIBLE}
    line = json_line(data)
    assert json.loads(line) == data
    assert not set(INVISIBLE) & set(line)
    assert "\\udb40\\udc73" in line  # the tag "s" as a surrogate pair, as JSON spells it
    assert "答" in line


def _rollouts_shown(episode: Episode, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`collab train rollouts` on a run folder whose one record holds `episode`."""
    run = tmp_path / "run"
    run.mkdir()
    record = {"step": 1, "correct": False, "gold": "4", "episode": episode.to_dict()}
    (run / ROLLOUTS).write_text(json.dumps(record) + "\n")
    shown = collab("train", "rollouts", str(run), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    return shown
