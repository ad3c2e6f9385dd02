"""Transcripts on a terminal: what a model wrote is shown, never obeyed."""

from __future__ import annotations

import json
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
    run = tmp_path / "run"
    run.mkdir()
    record = {"step": 1, "correct": False, "gold": "4", "episode": episode.to_dict()}
    (run / ROLLOUTS).write_text(json.dumps(record) + "\n")

    shown = collab("train", "rollouts", str(run), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
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
