"""The progress bar of the long commands (eval, build-warmup, filter)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


@contextmanager
def progress_bar(
    console: Console, description: str, shown: bool = True
) -> Iterator[Callable[[int, int], None]]:
    """A transient bar; the block gets a `(done, total)` callback to move it. `shown`
    False: no bar (the other processes of an `accelerate launch`)."""
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
