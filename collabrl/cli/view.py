"""`collab view PATH`: the episodes a run kept, as transcripts coloured by author.

One reader for both files that hold whole episodes: a training run's rollouts.jsonl
(each episode with its step, reward, the reward's parts by reward function and its
advantage: the numbers to read when GRPO misbehaves) and an eval's samples.jsonl (each
sample with its score). Every transcript follows its question; a training run shows
every step it kept unless told one (`--step N`, `--last`). `collab train rollouts RUN` is
this command on a training run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from collabrl import runs
from collabrl.cli.console import make_console
from collabrl.errors import UserError
from collabrl.tools.base import printable
from collabrl.train.run import ROLLOUTS

console = make_console()

FOLDER_HINT = "pass a run folder of `collab train grpo|relay|eapo|rsim` or `collab eval run`"


@dataclass(frozen=True)
class Kept:
    """The records of one file, and which of the two it is."""

    path: Path
    training: bool  # rollouts.jsonl of `collab train`; else samples.jsonl of `collab eval`
    records: list[dict[str, Any]]


def view(
    path: Path = typer.Argument(
        ...,
        help="A training run folder or its rollouts.jsonl; an eval run folder or its "
        "samples.jsonl.",
    ),
    step: int = typer.Option(
        None, "--step", help="Training: only this step (default: every step kept)."
    ),
    last: bool = typer.Option(False, "--last", help="Training: only the last step kept."),
    problem: str = typer.Option(None, "--problem", help="Only this problem's episodes (its id)."),
    correct: bool = typer.Option(
        None,
        "--correct/--wrong",
        help="Only the correct episodes (--correct) or only the wrong ones (--wrong) "
        "(default: both).",
    ),
    limit: int = typer.Option(
        None,
        "--limit",
        min=1,
        help="At most this many episodes, after the filters (default: all).",
    ),
    html: Path = typer.Option(
        None,
        "--html",
        help="Write a training run as one self-contained HTML page (provenance, held-out "
        "scores, curves, per-step table, transcripts) to this file instead of printing. "
        "Never one of the run's own files; a file that is not an earlier page only with "
        "--force.",
    ),
    force: bool = typer.Option(
        False, "--force", help="With --html: replace a file that is not an earlier page."
    ),
) -> None:
    """Print the episodes a run kept as transcripts, each segment coloured by its author
    (policy, teacher, expert, planner's guidance, tool): a training run's with their
    step, reward, the reward's parts and their advantage; an eval's with their score.
    `--html FILE` writes a training run as a page to open in a browser."""
    if html is not None:
        from collabrl.train.run_html import write_run_html

        run = path.parent if path.is_file() else path  # its rollouts.jsonl names the run too
        console.print(f"wrote {write_run_html(run, html, force)}", highlight=False)
        return
    if force:
        raise UserError("--force replaces a file --html names", "drop --force, or add --html FILE")
    show(path, step, last, problem, correct, limit)


def show(
    path: Path,
    step: int | None = None,
    last: bool = False,
    problem: str | None = None,
    correct: bool | None = None,
    limit: int | None = None,
) -> None:
    """Print the selected episodes of `path` (a run folder or its records file)."""
    from collabrl.cli.transcript import print_episode

    if step is not None and last:
        raise UserError("--step and --last both pick the step to show", "pass one of them")
    kept = read_kept(path)
    if not kept.training and (step is not None or last):
        raise UserError(f"{kept.path} is an eval's samples: it has no steps", "drop --step/--last")
    records = [r for r in kept.records if problem is None or _problem(r) == problem]
    if problem is not None and not records:
        raise UserError(f"{kept.path} holds no episode of problem {printable(problem)}")
    if kept.training:
        records = _at_steps(records, step, last)
    if correct is not None:
        records = [r for r in records if bool(r.get("correct")) is correct]
    shown = records[:limit]
    # Numbered as in the file (blank lines aside), whatever the filters left.
    numbers = {id(record): number for number, record in enumerate(kept.records, 1)}
    for record in shown:
        episode = runs.episode_in(record, f"{kept.path}: record {numbers[id(record)]}")
        console.print(rollout_header(record) if kept.training else sample_header(record))
        question = episode.meta.get("question")
        if question is not None:  # what the policy was asked, before what it wrote
            console.print(question_line(question))
        print_episode(console, episode)
    console.print(f"{len(shown)} of {len(kept.records)} episodes in {kept.path}", highlight=False)


def read_kept(path: Path) -> Kept:
    """The records `path` names: a run folder's rollouts.jsonl or samples.jsonl, or one of
    those files; refused in one line when it is neither."""
    if path.is_dir():
        found = [path / name for name in (ROLLOUTS, runs.SAMPLES) if (path / name).is_file()]
        if not found:
            # A folder of several benchmarks' evals (`collab eval a,b --out DIR`) holds runs.
            below = sorted(str(p.parent) for p in path.glob(f"*/{runs.SAMPLES}"))
            hint = f"pass one of its runs: {', '.join(below)}" if below else FOLDER_HINT
            raise UserError(f"no {ROLLOUTS} or {runs.SAMPLES} in {path}", hint)
        path = found[0]
    elif not path.is_file():
        raise UserError(f"no file or folder {path}", FOLDER_HINT)
    records = runs.read_records(path)  # refuses lines that are not JSON objects
    if not records:
        raise UserError(f"{path} holds no episode yet", "wait for the first step or sample")
    first = records[0]
    if "step" in first and "episode" in first:
        training = True
    elif "item_id" in first and "sample" in first:
        training = False
    else:
        raise UserError(
            f"{path} is neither a training run's {ROLLOUTS} nor an eval's {runs.SAMPLES}",
            FOLDER_HINT,
        )
    return Kept(path, training, records)


def _is_step(value: Any) -> bool:
    """A step number as trainers write it (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _problem(record: dict[str, Any]) -> Any:
    episode = record.get("episode")
    return record.get("item_id", episode.get("problem_id") if isinstance(episode, dict) else None)


def _at_steps(records: list[dict[str, Any]], step: int | None, last: bool) -> list[dict[str, Any]]:
    """The records of `step`, or of the `last` step kept, or (neither) of every step."""
    steps = sorted({r["step"] for r in records if _is_step(r.get("step"))})
    if step is None and not last:
        return records
    if not steps:
        raise UserError("no record holds a step number", FOLDER_HINT)
    wanted = steps[-1] if step is None else step
    if wanted not in steps:
        raise UserError(f"step {wanted} was not kept", f"kept steps: {steps[0]}–{steps[-1]}")
    return [r for r in records if r.get("step") == wanted]


def rollout_header(record: dict[str, Any]) -> Text:
    """A training episode's line: its step, score, reward with its parts, and advantage
    (older runs kept no reward: only what the record has)."""
    parts = [f"step {record.get('step')}", *_score(record)]
    if record.get("reward", "absent") != "absent":
        parts_by_name = record.get("rewards")
        terms = " · ".join(
            f"{name} {_num(v)}"
            for name, v in (parts_by_name if isinstance(parts_by_name, dict) else {}).items()
        )
        parts.append(f"reward {_num(record['reward'])}" + (f" ({terms})" if terms else ""))
    if "advantage" in record:
        parts.append(f"advantage {_num(record['advantage'], '+.3f')}")
    return _line(parts)


def question_line(question: Any) -> Text:
    """The question an episode answers, as the policy read it (its prompt template
    aside), through `shown`: a question is data too, and may hold a control byte."""
    from collabrl.cli.transcript import shown

    text = Text("question ", style="bold")
    text.append(shown(str(question)))
    return text


def sample_header(record: dict[str, Any]) -> Text:
    """An eval sample's line: its problem, sample index and score."""
    parts = [f"problem {record.get('item_id')}", f"sample {record.get('sample')}"]
    parts += _score(record)
    if "f1" in record:
        parts.append(f"f1 {_num(record['f1'])}")
    return _line(parts)


def _score(record: dict[str, Any]) -> list[str]:
    return [f"{key} {record[key]}" for key in ("correct", "gold") if key in record]


def _num(value: Any, spec: str = ".3f") -> str:
    """A number as shown; None (a reward function that did not apply) as n/a."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return "n/a" if value is None else str(value)


def _line(parts: list[str]) -> Text:
    """One bold header line; a Text, so that brackets in a gold answer or a problem id
    are not read as markup, and through `printable`, so no control byte acts."""
    return Text(printable(" · ".join(parts)), style="bold")
