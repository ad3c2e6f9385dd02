"""The consoles of the `collab` commands, and how they print where no one watches.

A batch job's output (a SLURM log, a pipe, `| tee`) is not a terminal: rich would then lay
tables out in 80 columns (or a terminal's width, read from stdin), shrinking every cell of
a wide table to `0.…`. The consoles made here take the width a table needs instead
(COLUMNS, when set, still decides), print no colour codes (rich's own rule, unless
FORCE_COLOR), and the libraries' own tqdm bars, which fill a log with carriage returns, are
turned off (`quiet_library_bars`).
"""

from __future__ import annotations

import os
from typing import IO, Any

from rich.console import Console, ConsoleDimensions, JustifyMethod
from rich.rule import Rule

# Wide enough that no table of ours is ever cut; rich sizes a table to its content, so a
# narrow one stays narrow. Only longer lines wrap.
LOG_WIDTH = 10_000
# A rule spans the console's width: in a log, it is drawn this wide.
LOG_RULE_WIDTH = 80

# Off in a batch job: the bars of huggingface_hub and transformers ("Loading weights"; both
# read it when imported), of datasets, and every bar drawn with tqdm itself (TQDM_DISABLE,
# read by each bar as it is made), such as transformers' GGUF de-quantization.
LIBRARY_BAR_SWITCHES = (
    "HF_HUB_DISABLE_PROGRESS_BARS",
    "HF_DATASETS_DISABLE_PROGRESS_BARS",
    "TQDM_DISABLE",
)


class _Console(Console):
    """rich's console, as wide as its tables need when its output is not a terminal.

    Decided at each print, not when the module-level consoles are made: the stream (and
    COLUMNS) may change in between, as under a test runner."""

    @property
    def logs(self) -> bool:
        """Whether this console writes a log: no terminal, no notebook, no COLUMNS."""
        return not (self.is_terminal or self.is_jupyter or "COLUMNS" in self._environ)

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        return ConsoleDimensions(LOG_WIDTH, size.height) if self.logs else size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def rule(
        self,
        title: Any = "",
        *,
        characters: str = "─",
        style: str = "rule.line",
        align: JustifyMethod = "center",
    ) -> None:
        rule = Rule(title, characters=characters, style=style, align=align)  # type: ignore[arg-type]
        self.print(rule, width=LOG_RULE_WIDTH if self.logs else None)


def make_console(stderr: bool = False, file: IO[str] | None = None) -> Console:
    """The console every command prints with (on stdout, or `stderr`, or `file`)."""
    return _Console(stderr=stderr, file=file)


def quiet_library_bars(*streams: IO[str]) -> None:
    """Turn the libraries' progress bars off when one of `streams` (stdout, where our own
    progress goes, and stderr, where tqdm draws) is not a terminal: our own progress
    (cli/progress.py) then logs lines, and a bar redrawn between them, or into a log, is
    noise. Set before those libraries are imported, which read it then; a value the user
    set stays."""
    if all(stream.isatty() for stream in streams):
        return
    for name in LIBRARY_BAR_SWITCHES:
        os.environ.setdefault(name, "1")
