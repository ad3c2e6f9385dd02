"""`collab eval --protocol …` and the router report, run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import assert_one_line_error, collab
from tests.servers import ServerProcess


def _eval(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    result = collab("eval", "gsm8k", "--limit", "2", "--out", str(out), *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return out


def test_relay_eval_with_smollm2_teacher_over_the_embedded_server(tmp_path: Path) -> None:
    with ServerProcess("smollm2-135m", role="teacher") as teacher:
        out = _eval(
            tmp_path, "relay", "--protocol", "relay", "--teacher", teacher.url,
            "--max-tokens", "24",
        )  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"call_ratio", "call_ratio_requested", "calls_per_sample"} <= metrics.keys()
    sample = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert sample["episode"]["meta"]["protocol"] == "relay"
    assert sample["episode"]["segments"][0]["author"] == "policy"


def test_router_report_from_student_and_teacher_runs(tmp_path: Path, tiny_model_dir: Path) -> None:
    tiny = str(tiny_model_dir)
    student = _eval(tmp_path, "student", "--model", tiny, "--max-tokens", "4")
    teacher = _eval(tmp_path, "teacher", "--model", tiny, "--max-tokens", "8")
    result = collab(
        "eval", "report", str(student), "--student", str(student), "--teacher", str(teacher),
        "--format", "markdown", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| router | accuracy | call_ratio | routed |" in result.stdout
    assert "| perfect router |" in result.stdout and "random router p=0.50" in result.stdout
    half = collab("eval", "report", str(student), "--student", str(student), cwd=tmp_path)
    assert_one_line_error(half, "router baselines need both runs")


def test_eval_unknown_protocol_is_one_line(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--protocol", "duet", "--limit", "1", cwd=tmp_path)
    assert_one_line_error(result, "unknown protocol 'duet'")


def test_relay_eval_with_the_reference_stand_in(tmp_path: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "stand-in"
    result = collab(
        "eval", "arith", "--limit", "2", "--out", str(out), "--model", str(tiny_model_dir),
        "--protocol", "relay", "--teacher", "reference", "--max-tokens", "8", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert "stand-in" in metrics["stand_in"] and metrics["problems"] == 2
    assert "stand-in" in result.stdout  # the summary says it too


def test_infer_with_the_reference_stand_in_needs_a_benchmark_item(tmp_path: Path) -> None:
    result = collab("infer", "relay", "What is 2+2?", "--teacher", "reference", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "the reference stand-in needs a benchmark item")
