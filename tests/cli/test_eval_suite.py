"""`collab eval A,B` and `collab eval report --plot`, run as the installed `collab` script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_line_error, collab
from tests.servers import ServerProcess

TINY = ("--limit", "1", "--max-tokens", "2")


def test_two_benchmarks_in_one_command(tiny_model_dir, tmp_path: Path) -> None:
    command = ("eval", "aime24,math500", "--model", str(tiny_model_dir), *TINY, "--n", "2")
    result = collab(*command, "--out", "both", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    table = result.stdout
    header = next(line for line in table.splitlines() if "benchmark" in line)
    for column in ("problems", "pass@1", "pass@2", "avg@2", "maj@2", "f1@2", "stderr"):
        assert column in header, column
    rows = [line for line in table.splitlines() if "aime24" in line or "math500" in line]
    assert any(line.lstrip("│ ").startswith("aime24") for line in rows)
    assert any(line.lstrip("│ ").startswith("math500") for line in rows)
    assert "aime24: 2 new samples · run folder: both/aime24" in table
    assert "math500: 2 new samples · run folder: both/math500" in table
    assert table.count("┏") == 1  # one summary table
    for name in ("aime24", "math500"):
        metrics = json.loads((tmp_path / "both" / name / "metrics.json").read_text())
        assert metrics["problems"] == 1 and metrics["samples_per_problem"] == 2

    again = collab(*command, "--out", "both", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "aime24: 0 new samples" in again.stdout and "math500: 0 new samples" in again.stdout

    # One benchmark of the two, resumed on its own: its folder is an ordinary run folder.
    alone = collab("eval", "math500", "--model", str(tiny_model_dir), *TINY, "--n", "2",
                   "--out", "both/math500", cwd=tmp_path)  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    assert "0 new samples · run folder: both/math500" in alone.stdout


@pytest.mark.parametrize(
    ("benchmarks", "problem"),
    [
        ("aime24,gsm9k", "unknown benchmark 'gsm9k'"),
        ("gsm9k,aime24", "unknown benchmark 'gsm9k'"),
        ("", "no benchmark given"),
        (",", "no benchmark given"),
        ("aime24,,math500", "an empty benchmark name"),
        ("aime24,aime24", "benchmark 'aime24' is named twice"),
    ],
)
def test_bad_benchmark_lists_are_one_line(tmp_path: Path, benchmarks: str, problem: str) -> None:
    home = tmp_path / "home"  # where a model load would convert the embedded weights
    result = collab(
        "eval", benchmarks, "--model", "smollm2-135m", "--out", "out", *TINY,
        cwd=tmp_path, env={"COLLABRL_HOME": str(home)},
    )  # fmt: skip
    assert_one_line_error(result, problem)
    assert not home.exists() and not (tmp_path / "out").exists()


def test_report_labels_rows_and_plots_pass_at_k(tiny_model_dir, tmp_path: Path) -> None:
    for n, out in (("1", "one"), ("4", "four")):
        result = collab("eval", "aime24,amc23", "--model", str(tiny_model_dir), *TINY,
                        "--n", n, "--temperature", "1", "--out", out, cwd=tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr
    folders = ["one/aime24", "one/amc23", "four/aime24", "four/amc23"]
    report = collab("eval", "report", *folders, "--format", "markdown", "--plot", "k.png",
                    cwd=tmp_path)  # fmt: skip
    assert report.returncode == 0, report.stderr
    lines = report.stdout.strip().splitlines()
    assert lines[0].startswith("| run | model | protocol | benchmark | n | problems | pass@1 |")
    model = str(tiny_model_dir)
    assert lines[2].startswith(f"| one/aime24 | {model} | solo | aime24 | 1 | 1 |")
    assert lines[5].startswith(f"| four/amc23 | {model} | solo | amc23 | 4 | 1 |")
    # After one warning per run: every sample was cut at --max-tokens 2.
    assert report.stderr.splitlines()[-1] == "pass@k plot: k.png"
    assert (tmp_path / "k.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("empty",), "has no metrics.json"),
        (("notes.txt",), "is not a folder"),
        (("foreign",), "not written by `collab eval`"),  # say, a training run's metrics
        (("run", "--plot", "x.xyz"), "--plot x.xyz does not end in .png, .pdf, .svg"),
        (("run", "--plot", "no/x.png"), "cannot write the plot no/x.png"),
    ],
)
def test_report_refusals_are_one_line(tmp_path: Path, args: tuple[str, ...], problem: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "metrics.json").write_text('{"loss": 0.1}')
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text('{"problems": 1, "samples_per_problem": 1, "pass@1": 1.0}')
    (run / "samples.jsonl").write_text('{"item_id": "a", "sample": 0, "correct": true}\n')
    assert_one_line_error(collab("eval", "report", *args, cwd=tmp_path), problem)


def test_a_password_in_the_model_url_is_not_in_the_suite_table(
    tiny_model_dir, tmp_path: Path
) -> None:
    """The suite table's title names the model: a URL's password stays out of it."""
    with ServerProcess(tiny_model_dir) as server:
        server.wait_ready()
        url = server.url.replace("http://", "http://me:hunter2@")
        result = collab("eval", "aime24,math500", "--model", url, *TINY, "--out", "both",
                        cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout + result.stderr
    assert "me:<redacted>@127.0.0.1" in result.stdout.replace("\n", "")
