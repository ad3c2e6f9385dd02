"""`collab serve`'s config: limits a server cannot run with are refused before it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "collabrl.cli.main", "serve", "expert", *args, "--dry-run"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("key", ["max_stop_strings", "max_stop_length"])
def test_a_negative_stop_string_limit_is_a_one_line_error(key: str) -> None:
    done = _serve("--engine", "transformers", "--set", f"{key}=-1")
    assert done.returncode != 0
    assert done.stderr.strip() == f"error: {key} must be 0 or more, got -1"
    assert _serve("--engine", "transformers", "--set", f"{key}=16").returncode == 0


def test_a_context_length_below_one_is_a_one_line_error() -> None:
    done = _serve("--engine", "transformers", "--set", "engine.max_model_len=0")
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "error: engine.max_model_len must be a context length in tokens, at least 1, got 0"
    )
