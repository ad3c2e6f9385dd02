"""The `collab` command line: thin Typer commands over library functions."""

import sys


def is_interrupt(error: BaseException) -> bool:
    """A Ctrl-C, or an error raised because of one or while handling one: Python 3.11 wraps
    an exception raised while a class body binds its fields (a dataclass, as
    `rich.progress` defines at import) in a RuntimeError whose cause is the interrupt."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        link = pending.pop()
        if link is None or id(link) in seen:
            continue
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        pending += [link.__cause__, link.__context__]
    return False


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
