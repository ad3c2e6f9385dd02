"""Warnings printed before a command starts (`collabrl/eval/cautions.py` finds them): one
line each, `warning:` in yellow on a terminal, plain in a pipe or a batch log."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.markup import escape


def print_warnings(console: Console, warnings: Iterable[str | None]) -> None:
    """Print each warning that is not None on one line: a batch log keeps it whole
    (soft_wrap: no break at the console's width), a path in it is not read as markup."""
    for warning in warnings:
        if warning is not None:
            console.print(
                f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True
            )
