"""`collab eval report` on run folders it cannot read (issue 33, "Report inputs"): one
`error:` line through the installed script, no traceback, nothing written; and the right
result where the input is odd but valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl import runs
from tests.cli.test_cli import assert_one_line_error, collab

CONFIG = "model: m\nbenchmark: arith\nprotocol: {name: solo}\nsampling: {temperature: 0.6}\n"
METRICS = {"problems": 1.0, "samples_per_problem": 1.0, "pass@1": 1.0, "avg@1": 1.0}
SAMPLE = {"item_id": "arith-test-add1-0000", "sample": 0, "correct": True}


def _run(folder: Path, config: str = CONFIG, metrics: str | None = None, samples=None) -> Path:
    folder.mkdir()
    (folder / runs.CONFIG).write_text(config)
    (folder / runs.METRICS).write_text(metrics or json.dumps(METRICS))
    body = samples if samples is not None else (json.dumps(SAMPLE) + "\n").encode()
    (folder / runs.SAMPLES).write_bytes(body)
    return folder


def _sample(**changes: object) -> bytes:
    record = {k: v for k, v in {**SAMPLE, **changes}.items() if v is not None}
    return (json.dumps(record) + "\n").encode()


@pytest.mark.parametrize(
    ("config", "metrics", "error"),
    [
        ("protocol: 5\n", None, "config.yaml: protocol is 5, of the wrong type"),
        ("model: [1, 2]\n", None, "config.yaml: model is [1, 2], of the wrong type"),
        ("sampling: {temperature: hot}\n", None, "temperature is 'hot', of the wrong type"),
        (CONFIG, '{"samples_per_problem": "abc"}', "samples_per_problem is 'abc', not a count"),
        (CONFIG, '{"samples_per_problem": 1e400}', "samples_per_problem is inf, not a count"),
        (CONFIG, '{"samples_per_problem": 0}', "samples_per_problem is 0, not a count"),
        (CONFIG, '{"samples_per_problem": 1, "pass@1": "high"}', "pass@1 is 'high', not a"),
    ],
)
def test_a_config_or_metrics_of_the_wrong_types_is_refused(
    tmp_path: Path, config: str, metrics: str | None, error: str
) -> None:
    _run(tmp_path / "r", config, metrics)
    assert_one_line_error(collab("eval", "report", "r", cwd=tmp_path), error)


@pytest.mark.parametrize(
    ("samples", "error"),
    [
        (_sample(item_id=None), "samples.jsonl: record 1 has no item_id"),
        (_sample(sample=None), "samples.jsonl: record 1 has no sample"),
        (_sample(sample="x"), "record 1 has sample 'x', of the wrong type"),
        (_sample(item_id=7), "record 1 has item_id 7, of the wrong type"),
        (_sample(correct="yes"), "record 1 has correct 'yes', of the wrong type"),
        (b'{"item_id": "\xff", "sample": 0, "correct": true}\n', "is not UTF-8 text"),
    ],
)
@pytest.mark.parametrize("option", [["--by", "(add1)"], ["--plot", "k.png"]])
def test_samples_that_eval_does_not_write_are_refused(
    tmp_path: Path, samples: bytes, error: str, option: list[str]
) -> None:
    _run(tmp_path / "r", samples=samples)
    assert_one_line_error(collab("eval", "report", "r", *option, cwd=tmp_path), error)
    assert not (tmp_path / "k.png").exists()


def test_router_baselines_refuse_samples_without_tokens(tmp_path: Path) -> None:
    _run(tmp_path / "r")
    result = collab("eval", "report", "r", "--student", "r", "--teacher", "r", cwd=tmp_path)
    assert_one_line_error(result, "record 1 has no completion_tokens")


@pytest.mark.parametrize("by", ["arith-(x)?", "(x)|arith"])
def test_a_group_that_captures_nothing_is_other(tmp_path: Path, by: str) -> None:
    _run(tmp_path / "r")
    result = collab("eval", "report", "r", "--by", by, "--format", "markdown", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| r | (other) | 1 | 1.0000 |" in result.stdout


@pytest.mark.parametrize(
    ("target", "error"),
    [("plots", "--plot plots is a folder"), ("passk", "--plot passk does not end in .png")],
)
def test_a_plot_path_that_would_not_be_the_file_written_is_refused(
    tmp_path: Path, target: str, error: str
) -> None:
    _run(tmp_path / "r")
    (tmp_path / "plots").mkdir()
    assert_one_line_error(collab("eval", "report", "r", "--plot", target, cwd=tmp_path), error)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots", "r"]  # no passk.png
    assert list((tmp_path / "plots").iterdir()) == []


def test_the_report_shows_strict_and_flexible_grading(tmp_path: Path) -> None:
    metrics = {**METRICS, "strict-match": 0.5, "flexible-extract": 1.0}
    _run(tmp_path / "r", metrics=json.dumps(metrics))
    result = collab("eval", "report", "r", "--format", "markdown", cwd=tmp_path)
    header, _, row = result.stdout.strip().splitlines()
    assert "| pass@1 | strict-match | flexible-extract | avg@n |" in header
    assert "| 1.0000 | 0.5000 | 1.0000 | 1.0000 |" in row
