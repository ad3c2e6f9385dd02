"""The `collab` command line: thin Typer commands over library functions."""

import sys

from collabrl.cli.interrupts import is_interrupt


def main() -> None:
    """The `collab` command. Its modules load here, inside the guard: a Ctrl-C while they
    load is one line and exit 130, as during a command (`cli.main.main`), not Python's
    traceback of whichever import it landed in."""
    try:
        from collabrl.cli.main import main as run
    except BaseException as error:
        if not is_interrupt(error):
            raise
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    run()
