"""The one exception type a user can cause.

Anything raised as `UserError` is printed by the CLI as a single line (the
problem, then the fix) with a non-zero exit; everything else is a bug and
keeps its traceback.
"""


class UserError(Exception):
    """A problem in the user's input or environment, with a hint how to fix it."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}; {fix}" if fix else problem)
