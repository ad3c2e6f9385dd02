"""The one exception type a user can cause, and `require`, the check that raises it.

Anything raised as `UserError` is printed by the CLI as a single line (the
problem, then the fix) with a non-zero exit; everything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

from typing import Any


class UserError(Exception):
    """A problem in the user's input or environment, with a hint how to fix it."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}; {fix}" if fix else problem)


class MissingInput(UserError):
    """A value the run needs and nobody gave yet (a relay run's teacher): `collab config
    show` shows such a config with a note, where other errors refuse it."""


def require(key: str, value: Any, ok: bool, must: str) -> None:
    """Raise the one-line error `KEY must be MUST, got VALUE` unless `ok`; the CLI names the
    option of KEY in front of it (`cli.options.check` reads KEY as the first word)."""
    if not ok:
        raise UserError(f"{key} must be {must}, got {value!r}")


def unknown_name(kind: str, name: str, known: list[str], broken: dict[str, str]) -> UserError:
    """The error for a registry lookup of `name` that found nothing: the names it holds,
    and the plugins whose registration failed (`broken`: plugin -> why), which may be the
    one the user meant."""
    fix = f"use one of {', '.join(known)}"
    if broken:
        failed = "; ".join(f"{plugin}: {why}" for plugin, why in broken.items())
        fix += f" (plugins that failed to load: {failed})"
    return UserError(f"unknown {kind} '{name}'", fix)
