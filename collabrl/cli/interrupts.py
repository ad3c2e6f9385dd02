"""What counts as a Ctrl-C, however it reaches the command line."""


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
