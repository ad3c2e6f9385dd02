"""`collab build-warmup relay|rsim|consult` as a user runs it: a real process, killed with
SIGKILL mid-build and resumed; one-line errors; the config listing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from collabrl.builders.folder import ROWS, STATS
from tests.cli.test_cli import COLLAB, assert_one_line_error, collab


def _relay_args(model: Path, out: Path) -> list[str]:
    return [
        "build-warmup", "relay", "--model", str(model), "--data", "arith", "--limit", "12",
        "--max-tokens", "24", "--temperature", "1.0", "--batch-size", "1", "--out", str(out),
    ]  # fmt: skip


def test_a_build_killed_with_sigkill_resumes_to_the_uninterrupted_rows(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    whole = collab(*_relay_args(tiny_model_dir, tmp_path / "whole"), cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    expected = (tmp_path / "whole" / ROWS).read_text()

    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [str(COLLAB), *_relay_args(tiny_model_dir, out)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        rows = out / ROWS
        if rows.exists() and len(rows.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    kept = len((out / ROWS).read_text().splitlines())
    assert 3 <= kept < 12, "the kill came after the build finished"

    resumed = collab(*_relay_args(tiny_model_dir, out), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / ROWS).read_text() == expected
    assert json.loads((out / STATS).read_text())["units"] == 12


def test_changing_the_experiment_of_a_built_folder_is_one_line(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = _relay_args(tiny_model_dir, tmp_path / "out")
    assert collab(*args, cwd=tmp_path).returncode == 0
    again = collab(*args, "--insertions", "2", cwd=tmp_path)
    assert_one_line_error(again, "different insertions", "new --out folder")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["relay", "--insertions", "0"], "--insertions"),
        (["relay", "--data", "no-such-set"], "unknown benchmark 'no-such-set'"),
        (["relay", "--model", "no-such-model"], "no-such-model"),
        (["rsim", "--rows", "0"], "--rows"),
        (["rsim", "--max-tokens", "0"], "--max-tokens"),
        (["consult", "--call-fraction", "1.5"], "--call-fraction"),
        (["consult", "--num-experts", "0"], "--num-experts"),
        (["consult", "--data", "no-such-set"], "unknown benchmark 'no-such-set'"),
    ],
)
def test_bad_values_are_refused_in_one_line_before_any_work(
    args: list[str], fragment: str, tmp_path: Path
) -> None:
    result = collab("build-warmup", *args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "out" / ROWS).exists()


def test_config_show_lists_the_builders_fields() -> None:
    for command, key in [
        ("build-warmup-relay", "insertions:"),
        ("build-warmup-rsim", "rows:"),
        ("build-warmup-consult", "call_fraction:"),
    ]:
        shown = subprocess.run(
            [str(COLLAB), "config", "show", command], capture_output=True, text=True, check=True
        ).stdout
        assert key in shown and "sampling:" in shown


def test_rsim_through_the_command_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    # The random model follows no format: every sample is rejected, with its reason.
    result = collab(
        "build-warmup", "rsim", "--model", str(tiny_model_dir), "--data", "arith",
        "--limit", "4", "--rows", "2", "--max-tokens", "16", "--out", "w", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    stats = json.loads((tmp_path / "w" / STATS).read_text())
    assert stats["sampled"] == 4 and sum(stats["rejected"].values()) + stats["rows"] == 4
    assert "data ran out" in result.stdout or stats["rows"] == 2


def test_consult_through_the_command_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = collab(
        "build-warmup", "consult", "--model", str(tiny_model_dir), "--data", "arith",
        "--limit", "4", "--call-fraction", "1", "--num-experts", "2", "--max-tokens", "8",
        "--out", "w", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    stats = json.loads((tmp_path / "w" / STATS).read_text())
    assert stats["call_rows"] == stats["read_rows"] == 4 and stats["call_share"] == 1.0
    assert stats["rows"] == 8 and stats["expert_answers_correct"] == 4  # the stand-in
    assert "call rows" in result.stdout
