"""A training run's output in a log (`collab train grpo … | cat`): one line a step, with
the numbers its method has, and the progress lines only where no step line stands for
them (the held-out evaluation after the steps); no library bar in between."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from collabrl.cli.console import LIBRARY_BAR_SWITCHES, make_console, quiet_library_bars
from collabrl.cli.progress import ProgressLog
from collabrl.protocols import registry
from collabrl.train.run import step_line, step_line_keys


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# What a GRPO step logs, whatever its protocol: every episode has call extras.
SOLO_LOGS = {"reward": 0.25, "episodes/accuracy": 0.25, "episodes/call_ratio": 0.0}
SOLO_LOGS |= {"episodes/calls": 0.0, "loss": 0.01}


def test_a_training_log_has_one_line_a_step_then_the_evaluations_progress() -> None:
    out, clock = io.StringIO(), Clock()
    log = ProgressLog(make_console(file=out), "grpo · tiny on arith4", clock=clock, stepped=True)
    keys = step_line_keys(registry.get("solo"))
    log(0, 3)  # the recorder, when training begins
    for step in (1, 2, 3):
        clock.now += 10
        log(step, 3)  # the recorder, at the step's end
        out.write(step_line(SOLO_LOGS, step, 3, 10.0, keys) + "\n")  # then its line
    for done in range(0, 171, 17):  # the held-out evaluation: a phase of its own
        clock.now += 1
        log(done, 170)
    lines = out.getvalue().splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert steps == [
        f"step {n}/3 · reward 0.250 · accuracy 0.250 · 10.0 s/step · ETA 0m {10 * (3 - n):02d}s"
        for n in (1, 2, 3)
    ]
    progress = [line for line in lines if not line.startswith("step ")]
    assert progress[0] == "grpo · tiny on arith4: 0/170 (0%) 0s elapsed"
    assert progress[-1].startswith("grpo · tiny on arith4: 170/170 (100%)")
    assert not any("/3 (" in line for line in progress)  # no progress line for a step


def test_a_new_phase_of_the_same_size_is_seen_by_its_count_going_back() -> None:
    out = io.StringIO()
    log = ProgressLog(make_console(file=out), "run", clock=Clock(), stepped=True)
    for done in range(11):
        log(done, 10)
    log(0, 10)  # 10 held-out problems after 10 steps
    assert out.getvalue().splitlines() == ["run: 0/10 (0%) 0s elapsed"]


@pytest.mark.parametrize(
    ("protocol", "shown"),
    [
        ("solo", ["reward", "accuracy"]),
        ("apollo", ["reward", "accuracy"]),  # tools: no collaborator's help to count
        ("strategy", ["reward", "accuracy"]),
        ("relay", ["reward", "accuracy", "call ratio", "calls", "experts cut"]),
        ("consult", ["reward", "accuracy", "call ratio", "calls", "experts cut"]),
    ],
)
def test_a_step_line_shows_calls_only_where_a_collaborator_helps(
    protocol: str, shown: list[str]
) -> None:
    assert list(step_line_keys(registry.get(protocol))) == shown


def test_library_bars_are_off_when_only_stdout_is_piped(monkeypatch) -> None:
    for name in LIBRARY_BAR_SWITCHES:
        monkeypatch.setenv(name, "")  # recorded, so that the test's own values are undone
        monkeypatch.delenv(name)
    quiet_library_bars(Terminal(), Terminal())
    assert not any(name in os.environ for name in LIBRARY_BAR_SWITCHES)
    quiet_library_bars(io.StringIO(), Terminal())  # `collab train … | cat`
    assert all(os.environ[name] == "1" for name in LIBRARY_BAR_SWITCHES)


# As `collab` starts: the switches first, then a library draws a bar with tqdm itself, as
# transformers' GGUF de-quantization does (tqdm reads TQDM_DISABLE when first imported).
DRAWS_A_BAR = """
import sys
from collabrl.cli.console import quiet_library_bars
quiet_library_bars(sys.stdout, sys.stderr)
from tqdm.auto import tqdm
for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors"):
    pass
print("converted")
"""


@pytest.mark.parametrize("quiet", [True, False], ids=["collab", "without the switches"])
def test_no_tqdm_bar_reaches_a_terminal_when_stdout_is_piped(quiet: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k not in LIBRARY_BAR_SWITCHES}
    code = DRAWS_A_BAR if quiet else DRAWS_A_BAR.replace("quiet_library_bars(", "print(")
    terminal, stderr = pty.openpty()  # stderr a terminal, stdout a pipe
    # 80 columns: in a terminal of none, tqdm would draw an empty bar.
    fcntl.ioctl(stderr, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            text=True,
            timeout=120,
        )
    finally:
        os.close(stderr)
    drawn = b""
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        drawn += chunk
    os.close(terminal)
    assert result.stdout.endswith("converted\n")
    # Without the switches the bar is drawn: the check would see one.
    assert (b"GGUF" not in drawn) is quiet, drawn
