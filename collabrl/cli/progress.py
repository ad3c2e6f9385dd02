"""The progress of the long commands (eval, build-warmup, filter, train): a bar in a
terminal, periodic log lines elsewhere (a SLURM log, a pipe), where a redrawn bar is
either lost or a wall of carriage returns."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from collabrl.redact import redact_text

# A log line at least this often, and at every tenth of the work, and at its end.
LOG_EVERY_S = 60.0
LOG_STEPS = 10


@contextmanager
def progress_bar(
    console: Console, description: str, shown: bool = True, stepped: bool = False
) -> Iterator[Callable[[int, int], None]]:
    """A transient bar, or log lines when `console` is not a terminal; the block gets a
    `(done, total)` callback to move it. `shown` False: nothing (the other processes of an
    `accelerate launch`). `stepped`: the caller prints a line of its own for each step of
    the first phase (training's step lines, with the step count and ETA), so a log has
    no other line for it. The description is redacted (`collabrl.redact`): it names the
    model, which may be a URL with a password, and a log line is read and shared."""
    description = redact_text(description)
    if shown and not console.is_terminal:
        yield ProgressLog(console, description, stepped=stepped)
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not shown,
    ) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


class ProgressLog:
    """`(done, total)` callback that prints `DESCRIPTION: 40/120 (33%) 1m12s elapsed, ~2m24s
    left` when another tenth is done, when `every_s` passed since the last line, and at
    the end. A new total, or a count that goes back, starts a new phase (training's
    held-out evaluation after its steps); with `stepped`, the first phase prints nothing:
    its caller prints a line per step."""

    def __init__(
        self,
        console: Console,
        description: str,
        every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        stepped: bool = False,
    ) -> None:
        self.console = console
        self.description = description
        self.every_s = every_s
        self.clock = clock
        self.started = clock()
        # (done, time) when first told: the pace is measured from there, leaving out the
        # model loading before it and the part a resumed run had done.
        self.first: tuple[int, float] | None = None
        self.last: tuple[int, int, float] | None = None  # (done, tenth, time) last printed
        self.total: int | None = None  # the phase's total: a new one starts the count again
        self.done = 0  # the count last told
        self.quiet = stepped  # in the first phase, whose steps the caller prints

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if self.total is not None and (total != self.total or done < self.done):
            self.started, self.first, self.last = now, None, None  # a new phase
            self.quiet = False
        self.total, self.done = total, done
        if self.quiet:
            return
        if self.first is None:
            self.first = (done, now)
        tenth = done * LOG_STEPS // total if total > 0 else 0
        if self.last is not None:
            last_done, last_tenth, last_time = self.last
            finished = 0 < total <= done
            due = tenth > last_tenth or now - last_time >= self.every_s or finished
            if done == last_done or not due:
                return
        self.last = (done, tenth, now)
        self.console.print(self.line(done, total, now), highlight=False, soft_wrap=True)

    def line(self, done: int, total: int, now: float) -> str:
        """The log line for `done` of `total` (0: not known yet) at clock time `now`."""
        elapsed = f"{duration(now - self.started)} elapsed"
        if total <= 0:
            return f"{self.description}: {done} done, {elapsed}"
        text = f"{self.description}: {done}/{total} ({100 * done // total}%) {elapsed}"
        first_done, first_time = self.first or (done, now)
        if 0 < done < total and done > first_done and now > first_time:
            pace = (now - first_time) / (done - first_done)
            text += f", ~{duration(pace * (total - done))} left"
        return text


def duration(seconds: float) -> str:
    """`45s`, `1m12s`, `2h03m`: a log line's times."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
