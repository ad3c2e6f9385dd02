"""Ctrl-C on a `collab` command, as a terminal sends it: a real process and SIGINT. It
exits 130 with one line that says what was kept, and the same command resumes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from importlib import import_module
from pathlib import Path

import pytest

from collabrl.builders.folder import ROWS, STATS
from collabrl.cli.interrupts import is_interrupt
from tests.cli.test_build_command import _relay_args
from tests.cli.test_cli import COLLAB, collab


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    # SIGINT back to its default in the child, as under a terminal: a test runner started
    # in the background hands its children SIGINT ignored, and Python then never raises
    # KeyboardInterrupt.
    return subprocess.Popen(
        [str(COLLAB), *args],
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _rows(out: Path) -> list[str]:
    rows = out / ROWS
    return rows.read_text().splitlines() if rows.exists() else []


@pytest.mark.slow  # two builds of the tiny model, about 30 s
def test_ctrl_c_says_what_was_kept_and_the_build_resumes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    process = _start(_relay_args(tiny_model_dir, out), tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None and len(_rows(out)) < 3:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    kept = _rows(out)
    assert 3 <= len(kept) < 12, "the Ctrl-C came after the build finished"

    assert process.returncode == 130
    assert "Traceback" not in stderr
    # The last line, and the only one of ours (above it: the weights' loading bar).
    assert stderr.splitlines()[-1] == (
        "error: interrupted; finished work is saved: re-run the same command with the "
        "same --out to resume"
    )
    assert stderr.count("error:") == 1

    resumed = collab(*_relay_args(tiny_model_dir, out), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert _rows(out)[: len(kept)] == kept
    assert json.loads((out / STATS).read_text())["units"] == 12


def test_ctrl_c_while_the_command_loads_is_one_line_too(tmp_path: Path) -> None:
    """A Ctrl-C that lands while `collab` imports its modules, before any command runs:
    swept over the first few hundred milliseconds, never Python's traceback through the
    project's code. (The first milliseconds belong to the interpreter and pip's wrapper
    script, which import `re` before any line of ours can catch anything.)"""
    for delay in (0.02 * i for i in range(1, 16)):
        process = _start(["--version"], tmp_path)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        # A frame in one of the package's files; the wrapper script's own line (which
        # names `collabrl.cli`) and the interpreter's are not ours to guard.
        ours = re.search(r'File "[^"]*/collabrl/', stderr)
        assert not ours, f"after {delay:.2f} s:\n{stderr}"
        if process.returncode == 1 and "KeyboardInterrupt" in stderr:
            continue  # the interpreter's start-up (`site`, __main__'s loader): before us
        # Before Python handles SIGINT the default action ends it (-2, silently); after
        # the command ran, 0.
        assert process.returncode in (0, 130, -signal.SIGINT), (delay, stderr)
        if process.returncode == 130:
            assert stderr.strip().splitlines()[-1:] == ["error: interrupted"], (delay, stderr)


class _InterruptedWhileBound:
    def __set_name__(self, owner: type, name: str) -> None:
        raise KeyboardInterrupt


def _interrupt_inside_a_class_body() -> BaseException:
    """What a Ctrl-C that lands while a class binds its fields (as `rich.progress`'s
    dataclasses do at import) reaches the caller as, on this Python."""
    try:
        type("Task", (), {"fields": _InterruptedWhileBound()})
    except BaseException as error:  # noqa: BLE001 - the point is which kind arrives
        return error
    raise AssertionError("the class was built")


def test_a_ctrl_c_wrapped_by_a_class_body_is_still_an_interrupt() -> None:
    error = _interrupt_inside_a_class_body()
    assert is_interrupt(error)
    assert not is_interrupt(RuntimeError("Error calling __set_name__"))
    assert not is_interrupt(ValueError("x"))


def test_collab_says_one_line_when_a_command_is_interrupted_that_way(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def wrapped_interrupt(**_options: object) -> None:
        raise _interrupt_inside_a_class_body()

    cli_main = import_module("collabrl.cli.main")
    monkeypatch.setattr(cli_main, "app", wrapped_interrupt)
    monkeypatch.setattr(sys, "argv", ["collab", "--version"])
    with pytest.raises(SystemExit) as exit_:
        cli_main.main()
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: interrupted"


def test_an_error_raised_while_handling_a_ctrl_c_is_an_interrupt() -> None:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("cleanup failed") from None  # the cause hidden, the context kept
    except OSError as error:
        assert is_interrupt(error)
