"""`collab doctor`: this machine as a run sees it, on one screen; the checks live in
`collabrl.doctor`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from collabrl.cli.console import make_console

console = make_console()


def doctor() -> None:
    """Print the versions (torch and its CUDA, transformers, TRL, vLLM), the GPUs seen, the
    python tool's sandbox (bwrap, the seccomp filter's architecture), the model caches and
    the free disk. Exit 1 when something would stop a run, naming which runs and why."""
    from collabrl.doctor import examine, problems

    findings = examine(Path.cwd())
    table = Table(show_header=False, box=None, padding=(0, 2))
    for finding in findings:
        style = "red" if finding.problem else ""
        table.add_row(Text(finding.name, style="bold"), Text(finding.found, style=style))
    console.print(table)
    stopping = problems(findings)
    if not stopping:
        console.print("nothing here would stop a run", highlight=False)
        return
    for finding in stopping:
        console.print(Text(f"would stop {finding.problem}", style="red"), highlight=False)
    raise typer.Exit(1)
