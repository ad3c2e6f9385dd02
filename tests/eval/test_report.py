"""Tests for comparing finished runs (`collab eval report`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl import runs
from collabrl.config import save_config
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.report import load_run, report_rows, to_markdown


def _run(folder: Path, model: str, n: int, metrics: dict) -> Path:
    folder.mkdir(parents=True)
    config = EvalConfig(benchmark="aime24", model=model)
    config.sampling.n = n
    config.sampling.temperature = 0.6
    save_config(config, folder / runs.CONFIG)
    body = {"problems": 30.0, "samples_per_problem": float(n), **metrics}
    runs.write_json(folder / runs.METRICS, body)
    return folder


@pytest.fixture
def two_runs(tmp_path: Path) -> list[Path]:
    first = _run(
        tmp_path / "run-a",
        "smollm2-135m",
        1,
        {
            "pass@1": 0.1,
            "avg@1": 0.1,
            "maj@1": 0.1,
            "f1@1": 0.25,
            "var": 0.09,
            "stderr": 0.0557,
            "call_ratio": 0.0,
        },
    )
    second = _run(
        tmp_path / "run-b",
        "/models/qwen",
        4,
        {
            "pass@1": 0.3,
            "pass@4": 0.5,
            "avg@4": 0.3,
            "maj@4": 0.4,
            "f1@4": 0.45,
            "var": 0.12,
            "stderr": 0.06,
            "call_ratio": 0.125,
        },
    )
    return [first, second]


def test_load_run_reads_identity_and_metrics(two_runs: list[Path]) -> None:
    run = load_run(two_runs[1])
    assert run["run"] == str(two_runs[1])
    assert run["benchmark"] == "aime24"
    assert run["model"] == "/models/qwen"
    assert run["n"] == 4
    assert run["temperature"] == 0.6
    assert run["metrics"]["pass@4"] == 0.5


def test_report_rows_line_up_metrics_of_different_n(two_runs: list[Path]) -> None:
    header, rows = report_rows([load_run(r) for r in two_runs])
    assert header == [
        "run",
        "benchmark",
        "model",
        "n",
        "problems",
        "pass@1",
        "avg@n",
        "maj@n",
        "f1@n",
        "var",
        "stderr",
        "call_ratio",
    ]
    assert rows[0] == [
        "run-a",
        "aime24",
        "smollm2-135m",
        "1",
        "30",
        "0.1000",
        "0.1000",
        "0.1000",
        "0.2500",
        "0.0900",
        "0.0557",
        "0.0000",
    ]
    assert rows[1] == [
        "run-b",
        "aime24",
        "/models/qwen",
        "4",
        "30",
        "0.3000",
        "0.3000",
        "0.4000",
        "0.4500",
        "0.1200",
        "0.0600",
        "0.1250",
    ]


def test_metrics_missing_from_every_run_get_no_column(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", "m", 2, {"pass@1": 0.5, "avg@2": 0.5})
    header, rows = report_rows([load_run(run)])
    assert header[5:] == ["pass@1", "avg@n"]
    assert rows[0][5:] == ["0.5000", "0.5000"]


def test_a_metric_one_run_lacks_shows_a_dash(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", "m", 2, {"pass@1": 0.5, "avg@2": 0.5, "maj@2": 1.0})
    b = _run(tmp_path / "b", "m", 2, {"pass@1": 0.5, "avg@2": 0.5})
    header, rows = report_rows([load_run(a), load_run(b)])
    column = header.index("maj@n")
    assert rows[0][column] == "1.0000"
    assert rows[1][column] == "-"


def test_markdown_table(two_runs: list[Path]) -> None:
    header, rows = report_rows([load_run(r) for r in two_runs])
    lines = to_markdown(header, rows).splitlines()
    assert len(lines) == 4
    assert lines[0] == "| " + " | ".join(header) + " |"
    assert lines[1] == "|" + "---|" * len(header)
    assert lines[2].startswith("| run-a | aime24 | smollm2-135m | 1 | 30 | 0.1000 |")
    assert all(line.count("|") == len(header) + 1 for line in lines)


def test_run_without_config_still_reports(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    runs.write_json(
        folder / runs.METRICS, {"problems": 2.0, "samples_per_problem": 2.0, "avg@2": 0.25}
    )
    run = load_run(folder)
    assert (run["benchmark"], run["model"], run["n"]) == ("?", "?", 2)
    _, rows = report_rows([run])
    assert rows[0][-1] == "0.2500"


def test_missing_metrics_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        load_run(tmp_path)
    assert "has no metrics.json" in info.value.problem
    assert str(tmp_path) in info.value.problem


def test_corrupt_metrics_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / runs.METRICS).write_text('{"pass@1": 0.')
    with pytest.raises(UserError, match="not valid JSON"):
        load_run(tmp_path)


def test_report_of_a_real_run(tiny_model_dir, tiny_engine, tmp_path: Path) -> None:
    from collabrl.config import build_config
    from collabrl.eval.runner import run_eval

    out = tmp_path / "real"
    config = build_config(
        EvalConfig,
        [
            {
                "benchmark": "aime24",
                "model": str(tiny_model_dir),
                "limit": 2,
                "out": str(out),
                "sampling": {"n": 2, "max_tokens": 4},
            }
        ],
    )
    result = run_eval(config, engine=tiny_engine)
    run = load_run(out)
    assert run["n"] == 2 and run["model"] == str(tiny_model_dir)
    header, rows = report_rows([run])
    assert {"pass@1", "avg@n", "maj@n", "f1@n", "var", "stderr", "call_ratio"} <= set(header)
    assert rows[0][header.index("avg@n")] == f"{result.metrics['avg@2']:.4f}"
    assert rows[0][header.index("problems")] == "2"
    assert json.loads((out / runs.METRICS).read_text()) == run["metrics"]
