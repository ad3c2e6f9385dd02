"""`accelerate launch` on two CPU processes (configs/accelerate/cpu-2proc.yaml), for the
tests of multi-process runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TWO_PROCESSES = Path(__file__).resolve().parents[1] / "configs" / "accelerate" / "cpu-2proc.yaml"


def launch_two(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file cpu-2proc.yaml ARGS` in `cwd`, one thread a
    process. A run past `timeout` seconds is a hang: its whole process group (the
    launcher and both ranks) is killed and the test fails with its output."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    assert accelerate is not None
    command = [accelerate, "launch", "--config_file", str(TWO_PROCESSES), *args]
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"hung: no end after {timeout} s\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
