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
    episode = Episode(problem, prompt_ids=[1])
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


def test_a_training_run_shows_reward_parts_and_advantage_of_the_last_step(run: Path) -> None:
    shown = view(str(run))
    assert shown.count("step 2 · correct") == 2 and "step 1 ·" not in shown
    header = "step 2 · correct True · gold [7] · reward 0.750 (relay_simple 0.750 · brevity n/a)"
    assert header in shown
    assert "advantage +0.707" in shown and "advantage -0.707" in shown
    assert "2 of 4 episodes in " in shown
    # `collab train rollouts` is the same reader.
    alias = CliRunner().invoke(app, ["train", "rollouts", str(run)])
    assert alias.exit_code == 0 and alias.output == shown


def test_filters_select_steps_problems_correctness_and_a_count(run: Path) -> None:
    assert view(str(run), "--all").count(" · correct ") == 4
    assert view(str(run), "--step", "1").count("step 1 · correct") == 2
    # A problem is followed over every step kept, unless a step is named.
    assert view(str(run / ROLLOUTS), "--problem", "p2").count("step ") == 2
    assert view(str(run), "--problem", "p2", "--step", "2").count("step 2 · ") == 1
    wrong = view(str(run), "--all", "--wrong")
    assert wrong.count("correct False") == 2 and "correct True" not in wrong
    assert view(str(run), "--all", "--correct", "--limit", "1").count("correct True") == 1


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
    ],
    ids=[
        "missing",
        "empty folder",
        "suite folder",
        "neither",
        "empty file",
        "step of an eval",
        "bad episode",
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
