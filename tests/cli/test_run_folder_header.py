"""The header of a run folder's config.yaml as `collab eval` writes it in a real process:
the command line as run, and the file still a `--config` file and a report's input."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.cli.test_cli import COLLAB, collab


@pytest.mark.slow  # three `collab` starts
def test_collab_eval_records_its_command_and_reads_its_config_back(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ["eval", "aime24", "--model", str(tiny_model_dir), "--limit", "1"]
    args += ["--max-tokens", "2", "--out", "run"]
    first = collab(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr

    saved = tmp_path / "run" / "config.yaml"
    lines = saved.read_text().splitlines()
    assert f"# command: {shlex.join([str(COLLAB), *args])}" in lines
    # As a --config file it is the same experiment: the run resumes, with nothing to do.
    again = collab("eval", "aime24", "-c", str(saved), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 new samples" in again.stdout
    report = collab("eval", "report", "run", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert str(tiny_model_dir) in report.stdout
