"""`collab view`: one reader for a training run's rollouts.jsonl and an eval's
samples.jsonl, its filters, author colours, and one-line refusals."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collabrl import runs
from collabrl.cli.main import app
from collabrl.config import build_config
from collabrl.episode import Author, Episode, Segment
from collabrl.eval.config import EvalConfig
from collabrl.eval.runner import run_eval
from collabrl.train.run import ROLLOUTS
from tests.cli.test_cli import COLLAB, assert_one_line_error, collab


def view(*args: str) -> str:
    result = CliRunner().invoke(app, ["view", *args])
    assert result.exit_code == 0, result.output
    return result.output


def _rollout(step: int, problem: str, correct: bool, advantage: float) -> dict:
    episode = Episode(problem, prompt_ids=[1], meta={"question": f"What is {problem}?\x1b[2J"})
    episode.add(Segment(Author.POLICY, f"policy writes {problem} ", [2]))
    episode.add(Segment(Author.TEACHER, "teacher writes ", [3]))
    reward = float(correct) - 0.25
    parts = {"relay_simple": reward, "brevity": None}  # None: that function did not apply
    return {
        "step": step,
        "correct": correct,
        "gold": "[7]",  # brackets: not rich markup
        "reward": reward,
        "rewards": parts,
        "advantage": advantage,
        "episode": episode.to_dict(),
    }


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A training run folder: two steps of two problems, one right and one wrong each."""
    records = [
        _rollout(step, problem, correct, advantage)
        for step in (1, 2)
        for problem, correct, advantage in (("p1", True, 0.7071), ("p2", False, -0.7071))
    ]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ROLLOUTS).write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path / "run"


def test_a_training_run_shows_every_step_with_reward_parts_and_advantage(run: Path) -> None:
    shown = view(str(run))
    assert shown.count("step 1 · correct") == 2 and shown.count("step 2 · correct") == 2
    header = "step 2 · correct True · gold [7] · reward 0.750 (relay_simple 0.750 · brevity n/a)"
    assert header in shown
    assert "advantage +0.707" in shown and "advantage -0.707" in shown
    assert "4 of 4 episodes in " in shown
    # `collab train rollouts` is the same reader.
    alias = CliRunner().invoke(app, ["train", "rollouts", str(run)])
    assert alias.exit_code == 0 and alias.output == shown


def test_each_transcript_follows_its_question_shown_safely(run: Path) -> None:
    lines = view(str(run), "--step", "1").splitlines()
    for problem in ("p1", "p2"):
        at = lines.index(f"question What is {problem}?\\x1b[2J")  # the ESC as its escape
        assert lines[at - 1].startswith("step 1 · correct") and lines[at + 1] == "authors: " + (
            "policy teacher expert guidance tool environment "
        )


def test_filters_select_steps_problems_correctness_and_a_count(run: Path) -> None:
    assert view(str(run), "--step", "1").count("step 1 · correct") == 2
    last = view(str(run), "--last")
    assert last.count("step 2 · correct") == 2 and "step 1 ·" not in last
    assert view(str(run / ROLLOUTS), "--problem", "p2").count("step ") == 2
    assert view(str(run), "--problem", "p2", "--step", "2").count("step 2 · ") == 1
    wrong = view(str(run), "--wrong")
    assert wrong.count("correct False") == 2 and "correct True" not in wrong
    assert view(str(run), "--correct", "--limit", "1").count("correct True") == 1


def test_an_eval_run_shows_each_sample_with_its_score(
    tiny_model_dir: Path, tiny_engine, tmp_path: Path
) -> None:
    layer = {
        "benchmark": "gsm8k",
        "model": str(tiny_model_dir),
        "limit": 2,
        "out": str(tmp_path / "eval"),
        "sampling": {"n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 3},
    }
    run_eval(build_config(EvalConfig, [layer]), engine=tiny_engine)
    samples = [json.loads(line) for line in (tmp_path / "eval" / runs.SAMPLES).open()]

    shown = view(str(tmp_path / "eval"))
    for record in samples:
        line = f"problem {record['item_id']} · sample {record['sample']} · correct "
        assert line in shown
    assert "authors:" in shown and "4 of 4 episodes" in shown
    first = samples[0]["item_id"]
    one = view(str(tmp_path / "eval" / runs.SAMPLES), "--problem", first, "--limit", "1")
    assert one.count("problem ") == 1 and f"problem {first} · sample 0" in one


def test_each_author_has_its_colour_on_a_terminal(run: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"FORCE_COLOR": "1"}
    shown = subprocess.run(
        [str(COLLAB), "view", str(run)], env=env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert "\x1b[1;32mteacher writes" in shown.stdout  # STYLES: the teacher in bold green
    assert "\x1b[1;32mpolicy writes" not in shown.stdout


@pytest.mark.parametrize(
    ("make", "args", "error"),
    [
        (None, ["nowhere"], "no file or folder nowhere"),
        ("folder", ["empty"], "no rollouts.jsonl or samples.jsonl in empty; pass a run folder"),
        ("suite", ["suite"], "in suite; pass one of its runs: suite/aime24, suite/math500"),
        ('{"step": 1, "reward": 0.5}\n', ["metrics.jsonl"], "is neither a training run's"),
        ("", ["metrics.jsonl"], "holds no episode yet"),
        ('{"item_id": "p", "sample": 0}\n', ["metrics.jsonl", "--step", "1"], "has no steps"),
        ('{"step": 1, "episode": {}}\n', ["metrics.jsonl"], "record 1 holds no readable episode"),
        ('{"step": 1, "episode": "s"}\n', ["metrics.jsonl"], "record 1 holds no readable episode"),
        ('{"step": [1], "episode": {}}\n', ["metrics.jsonl", "--last"], "no record holds a step"),
        ('{"step": 1, "episode": {}}\n', ["metrics.jsonl", "--step", "1", "--last"], "pass one"),
    ],
    ids=[
        "missing",
        "empty folder",
        "suite folder",
        "neither",
        "empty file",
        "step of an eval",
        "bad episode",
        "string episode",
        "list step",
        "step and last",
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, make: str | None, args: list[str], error: str):
    if make == "folder":
        (tmp_path / "empty").mkdir()
    elif make == "suite":  # `collab eval aime24,math500 --out suite`: a run per benchmark
        for name in ("aime24", "math500"):
            (tmp_path / "suite" / name).mkdir(parents=True)
            (tmp_path / "suite" / name / runs.SAMPLES).write_text("")
    elif make is not None:
        (tmp_path / "metrics.jsonl").write_text(make)
    assert_one_line_error(collab("view", *args, cwd=tmp_path), error)


def test_html_writes_a_training_runs_page_from_the_folder_or_its_rollouts(
    tmp_path: Path,
) -> None:
    from tests.train.test_run_html import run as make_run

    folder = make_run.__wrapped__(tmp_path)  # the hand-written relay run of the HTML tests
    for given in (folder, folder / ROLLOUTS):
        out = tmp_path / "page" / "run.html"
        assert f"wrote {out}" in view(str(given), "--html", str(out))
        assert "<table" in out.read_text() and "relay" in out.read_text()
        out.unlink()


def test_html_of_an_eval_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / runs.SAMPLES).write_text("")
    (tmp_path / "ev" / runs.CONFIG).write_text("n: 1\n")
    result = collab("view", "ev", "--html", "p.html", cwd=tmp_path)
    assert_one_line_error(result, "is an eval's folder: the HTML page is of a training run")
    assert not (tmp_path / "p.html").exists()


# --- malformed records: a one-line refusal naming the record, never a traceback ---------


def _malformed(record: dict, where: tuple, value: object) -> dict:
    """`record` with the value at the path `where` (keys and indexes) replaced."""
    import copy

    changed = copy.deepcopy(record)
    node = changed
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return changed


@pytest.mark.parametrize(
    "where",
    [
        ("step",),
        ("rewards",),
        ("episode",),
        ("episode", "segments"),
        ("episode", "meta"),
        ("episode", "segments", 0),
        ("episode", "segments", 0, "text"),
        ("episode", "segments", 0, "token_ids"),
        ("episode", "segments", 0, "meta"),
    ],
    ids=lambda where: ".".join(map(str, where)),
)
@pytest.mark.parametrize("value", [[1], "s", 7, None, {"a": 1}], ids=repr)
def test_a_malformed_record_is_refused_or_shown_never_a_traceback(
    tmp_path: Path, where: tuple, value: object
) -> None:
    """A list where a mapping belongs, a string episode, a number for a text: `view` and
    `view --html` refuse in one line naming the record, or show what they can."""
    from collabrl.errors import UserError
    from tests.train.test_run_html import run as make_run

    folder = make_run.__wrapped__(tmp_path)
    records = runs.read_records(folder / ROLLOUTS)
    records[-1] = _malformed(records[-1], where, value)  # of the last step: shown by both
    (folder / ROLLOUTS).write_text("".join(json.dumps(r) + "\n" for r in records))
    for args in ([str(folder)], [str(folder), "--html", str(tmp_path / "p.html")]):
        result = CliRunner().invoke(app, ["view", *args])
        if result.exit_code != 0:
            assert isinstance(result.exception, UserError), result.exception
            assert f"{ROLLOUTS}: " in result.exception.problem
            assert "record" in result.exception.problem


def test_a_string_episode_in_a_page_is_one_line(tmp_path: Path) -> None:
    from tests.train.test_run_html import run as make_run

    folder = make_run.__wrapped__(tmp_path)
    with (folder / ROLLOUTS).open("a") as f:
        f.write(json.dumps({"step": 3, "episode": "not an episode"}) + "\n")
    result = collab("view", str(folder), "--html", "p.html", cwd=tmp_path)
    assert_one_line_error(result, "a step 3 record holds no readable episode")
    assert not (tmp_path / "p.html").exists()


# --- --html never writes over what it reads, nor over a file that is no page ------------


@pytest.fixture
def page_run(tmp_path: Path) -> Path:
    from tests.train.test_run_html import run as make_run

    return make_run.__wrapped__(tmp_path)


def _refused(run: Path, target: Path, *extra: str) -> str:
    from collabrl.errors import UserError

    result = CliRunner().invoke(app, ["view", str(run), "--html", str(target), *extra])
    assert result.exit_code != 0 and isinstance(result.exception, UserError), result.output
    return result.exception.problem


def _contents(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir()}


def test_html_onto_the_runs_config_is_one_line_and_leaves_it(page_run: Path) -> None:
    before = _contents(page_run)
    result = collab("view", ".", "--html", "config.yaml", cwd=page_run)
    assert_one_line_error(result, "is the run's own config.yaml: the page would write over it")
    assert _contents(page_run) == before


@pytest.mark.parametrize("name", ["config.yaml", "rollouts.jsonl", "metrics.jsonl", "eval.json"])
def test_html_never_writes_over_an_input_by_any_path(page_run: Path, name: str) -> None:
    before = _contents(page_run)
    link = page_run.parent / f"link-{name}"
    link.symlink_to(page_run / name)
    hard = page_run.parent / f"hard-{name}"
    os.link(page_run / name, hard)
    dotted = page_run / ".." / page_run.name / name
    for target in (page_run / name, link, hard, dotted):
        for force in ((), ("--force",)):
            assert f"own {name}" in _refused(page_run, target, *force)
    # From the rollouts file as the argument too: it names the same run.
    assert f"own {name}" in _refused(page_run / ROLLOUTS, page_run / name, "--force")
    assert _contents(page_run) == before


def test_html_never_writes_an_input_the_run_has_not_written_yet(page_run: Path) -> None:
    (page_run / "eval.json").unlink()  # a live run writes it at its end
    assert "own eval.json" in _refused(page_run, page_run / "eval.json", "--force")
    assert not (page_run / "eval.json").exists()
    assert "is a folder" in _refused(page_run, page_run, "--force")


def test_html_rewrites_its_own_page_and_another_file_only_with_force(
    page_run: Path, tmp_path: Path
) -> None:
    page = tmp_path / "run.html"
    view(str(page_run), "--html", str(page))
    page.write_text(page.read_text().replace("Held-out", "stale"))
    view(str(page_run), "--html", str(page))  # an earlier page: replaced without asking
    assert "stale" not in page.read_text()

    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert "exists and is not a page of collab view" in _refused(page_run, notes)
    assert notes.read_text() == "mine"
    view(str(page_run), "--html", str(notes), "--force")
    assert "<!DOCTYPE html>" in notes.read_text()

    # A link at the path is replaced, never written through, even with --force.
    precious = tmp_path / "precious.txt"
    precious.write_text("keep")
    link = tmp_path / "link.html"
    link.symlink_to(precious)
    assert "is not a page" in _refused(page_run, link)
    view(str(page_run), "--html", str(link), "--force")
    assert precious.read_text() == "keep" and not link.is_symlink()


def test_force_without_html_is_one_line(page_run: Path) -> None:
    from collabrl.errors import UserError

    result = CliRunner().invoke(app, ["view", str(page_run), "--force"])
    assert isinstance(result.exception, UserError)
    assert "--force replaces a file --html names" in result.exception.problem
