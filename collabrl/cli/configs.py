"""`collab config show COMMAND`: a command's resolved config, every field with its help."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from collabrl.cli import options as opt

app = typer.Typer(help="Inspect the configs of the commands.", no_args_is_help=True)


@app.command("show")
def show(
    command: str = typer.Argument(..., help=f"{', '.join(opt.CONFIG_CLASSES)}."),
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """Print COMMAND's config after --config and --set, as YAML with each field's help,
    checked as the command checks it: a value the command would refuse is refused here.

    The output is itself a valid --config file.
    """
    from collabrl.config import describe_config
    from collabrl.errors import MissingInput, UserError

    if command not in opt.CONFIG_CLASSES:
        raise UserError(f"no config for '{command}'", f"use one of {', '.join(opt.CONFIG_CLASSES)}")
    resolved = opt.load_config(command, config, {}, set_)
    try:
        resolved.check()
    except MissingInput as missing:  # shown: the run adds it on its command line
        print(f"note: {missing}", file=sys.stderr)
    print(describe_config(resolved), end="")
