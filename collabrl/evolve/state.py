"""The shared state: every candidate of every finished round, and how it is stored.

A candidate is one proposal of one model for one problem in one round, with what
was checked about it: the tool calls it ran (and whether they failed), its code
re-run in the sandbox (`code_check`) and the reviews it got. The run folder holds
one `round-R.jsonl` of candidates per finished round and `state.json`, the run's
index (rounds finished, answers selected, metrics). Both are replaced atomically,
the round file first: a round is finished once `state.json` lists it, so a run
killed in between redoes only that round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.episode import Author, Episode
from collabrl.errors import UserError
from collabrl.userfiles import read_json

STATE = "state.json"
BAD_STATE_FIX = "use a new --out folder"

# Verdicts a review can reach; `unknown` is a review whose verdict line was unreadable.
CORRECT, INCORRECT, UNKNOWN = "correct", "incorrect", "unknown"
# Verdicts of re-running a candidate's code (`execute.py`).
VERIFIED, REFUTED, UNVERIFIED = "verified", "refuted", "unverified"


@dataclass
class Review:
    reviewer: str  # the model reference or URL that reviewed
    verdict: str  # CORRECT | INCORRECT | UNKNOWN
    text: str


@dataclass
class CodeCheck:
    """A candidate's code re-run in the sandbox: the verdict, what ran, what it printed."""

    verdict: str  # VERIFIED | REFUTED | UNVERIFIED
    source: str | None  # tool_call | code_block | expression; None: nothing to run
    code: str
    output: str  # what it printed, or its failure, or why nothing ran


@dataclass
class Candidate:
    round: int  # 1-based
    problem_id: str
    model: int  # index into config.models
    branch: int
    answer: str | None
    completion: str
    checks: list[dict[str, Any]]  # the episode's tool calls: tool, error, text
    reviews: list[Review] = field(default_factory=list)
    # Against the gold answer: reported as accuracy, never read by selection or prompts.
    correct: bool = False
    episode: dict[str, Any] = field(default_factory=dict)
    code_check: CodeCheck | None = None  # None: not re-run (`execute` off)

    @property
    def verdict(self) -> str:
        """The re-run's verdict; UNVERIFIED when its code was never re-run."""
        return self.code_check.verdict if self.code_check else UNVERIFIED

    @property
    def score(self) -> float:
        """The verified score: the share of reviews with a `correct` verdict (an unknown
        verdict counts against, as a failed check would); 0 with no review."""
        if not self.reviews:
            return 0.0
        return sum(r.verdict == CORRECT for r in self.reviews) / len(self.reviews)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "score": self.score}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        data = {k: v for k, v in data.items() if k != "score"}
        check = data.get("code_check")
        return cls(
            **{
                **data,
                "reviews": [Review(**r) for r in data["reviews"]],
                "code_check": CodeCheck(**check) if check else None,
            }
        )


def checks_of(episode: Episode, limit: int) -> list[dict[str, Any]]:
    """The tool calls an episode ran, as the digest shows them (text cut to `limit`)."""
    return [
        {"tool": s.meta.get("tool"), "error": s.meta.get("error"), "text": s.text[:limit]}
        for s in episode.segments
        if s.author is Author.TOOL
    ]


def round_path(out_dir: Path, round_no: int) -> Path:
    return out_dir / f"round-{round_no}.jsonl"


def read_state(out_dir: Path) -> dict[str, Any]:
    """The run's index: `{"rounds": [...]}` with one entry per finished round."""
    path = out_dir / STATE
    if not path.exists():
        return {"rounds": []}
    try:
        state = read_json(path, "evolve state")
    except UserError as err:  # not JSON, or not UTF-8: edited by hand, or not ours
        raise UserError(f"{path} is not an evolve state ({err.problem})", BAD_STATE_FIX) from err
    if not isinstance(state, dict) or not isinstance(state.get("rounds"), list):
        raise UserError(f"{path} is not an evolve state (no list of rounds)", BAD_STATE_FIX)
    return state


def check_resumable(out: str | None) -> None:
    """`--resume` needs a run to continue, as `collab train --resume` does: a folder an
    evolve run started in (its config, or its state). Without one the flag was a mistake,
    a mistyped --out, not a fresh start; a run killed before its first round ended is
    continued from round 1."""
    if out is None:
        raise UserError("--resume needs --out, the run folder to continue", "pass --out FOLDER")
    folder = Path(out)
    if not (folder / runs.CONFIG).is_file() and not (folder / STATE).is_file():
        raise UserError(f"no evolve run to resume in {out}", "run without --resume")


def read_candidates(out_dir: Path, rounds: int) -> list[Candidate]:
    """Every candidate of rounds 1..`rounds`, in round order."""
    return [
        Candidate.from_dict(r)
        for round_no in range(1, rounds + 1)
        for r in runs.read_records(round_path(out_dir, round_no))
    ]


def save_round(
    out_dir: Path, state: dict[str, Any], candidates: list[Candidate], summary: dict[str, Any]
) -> None:
    """Store a finished round: its candidates, then the index that lists it."""
    runs.write_records(round_path(out_dir, summary["round"]), (c.to_dict() for c in candidates))
    state["rounds"].append(summary)
    runs.write_json(out_dir / STATE, state)
