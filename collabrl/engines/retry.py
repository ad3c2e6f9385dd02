"""Which failures of an expert call are worth another attempt, and how a failure is
told in a call's record."""

from __future__ import annotations

import openai

from collabrl.errors import UserError

# HTTP statuses worth another try: the server is busy or broke mid-request.
_TRANSIENT_STATUS = (408, 409, 429)


def is_transient(exc: BaseException, local: bool) -> bool:
    """Whether another attempt may succeed (a down or busy server) or is pointless."""
    if isinstance(exc, TimeoutError):
        # A local generate that timed out still runs and holds its model's lock: a retry
        # would only queue behind it. A remote server may have had a hiccup.
        return not local
    if isinstance(exc, UserError):
        if exc.__cause__ is None:
            return False  # our own diagnosis (bad model ref, no served model): final
        exc = exc.__cause__  # map_error keeps the openai exception as the cause
    if isinstance(exc, openai.APIConnectionError):  # includes the client's own timeout
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in _TRANSIENT_STATUS or exc.status_code >= 500
    if isinstance(exc, openai.OpenAIError | UserError | ValueError | TypeError):
        return False  # 401, 404, 400, a malformed prompt: the same request fails again
    return True  # e.g. a connection reset surfacing as OSError, a CUDA out-of-memory


def describe(exc: BaseException, timeout: float) -> str:
    """A failure as a call record's one-line error."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, UserError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
