"""`collab doctor`: one screen of what this machine gives a run, exit 1 naming what would
stop one. Through the real script; the machine's own libraries, sandbox and disks."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl import doctor
from tests.cli.test_cli import collab

ROWS = ("python", "torch", "transformers", "trl", "vllm", "GPUs", "seccomp", "bwrap")
ROWS += ("HF cache", "collabrl cache", "disk (run folders)")


def test_doctor_fits_one_screen_and_passes_on_a_machine_that_runs(tmp_path: Path) -> None:
    result = collab("doctor", cwd=tmp_path, env={"COLLABRL_HOME": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 24  # one screen
    names = {line.split("  ")[0].strip() for line in (line.strip() for line in lines)}
    assert set(ROWS) <= names, result.stdout
    assert lines[-1] == "nothing here would stop a run"
    assert f"free at {tmp_path}" in result.stdout


def test_doctor_exits_1_naming_what_would_stop_a_run(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    cache = tmp_path / "a-file" / "cache"  # can never be made
    result = collab("doctor", cwd=tmp_path, env={"COLLABRL_HOME": str(cache)})
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    assert result.stdout.splitlines()[-1] == (
        f"would stop embedded and .gguf models: {cache} is not writable (set COLLABRL_HOME "
        "to a folder that is)"
    )


def test_too_little_free_disk_is_a_problem(tmp_path: Path, monkeypatch) -> None:
    assert doctor.disk_finding("disk", tmp_path).problem is None
    monkeypatch.setattr(doctor, "MIN_FREE_GIB", 1e12)  # more than any disk holds
    problem = doctor.disk_finding("disk", tmp_path / "not-yet").problem
    assert problem is not None and "under 1e+12 GiB free" in problem


@pytest.mark.parametrize("name", ["torch", "transformers"])
def test_the_report_names_every_required_library(name: str) -> None:
    found = {f.name: f for f in doctor.library_findings()}
    assert found[name].problem is None and found[name].found[0].isdigit()
