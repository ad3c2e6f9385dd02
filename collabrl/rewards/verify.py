"""Is a predicted answer equivalent to the gold one? Safe to call from any thread.

math-verify bounds its sympy work with `signal.alarm`, which only works on the
main thread; called from a worker thread (a thread-pooled reward function, an
async server) it fails, and a caller that swallows the error silently scores
every hard answer as wrong. So:

1. a cheap fast path (string normalization, plain numbers) answers most cases
   without sympy, on any thread;
2. on the main thread math-verify runs in-process, with its own alarms;
3. off the main thread the job goes to a single spawned worker process, where
   math-verify runs on that process's main thread, alarms and all.

As with any "spawn" process, the worker re-imports the caller's main script, so
scripts that score answers from threads need the usual `if __name__ == "__main__":`.
"""

from __future__ import annotations

import atexit
import logging
import math
import multiprocessing
import multiprocessing.util
import os
import re
import threading
from concurrent.futures import CancelledError
from fractions import Fraction
from typing import Literal, get_args

from pebble import ProcessExpired, ProcessPool

log = logging.getLogger(__name__)

# Slack on top of math-verify's own timeouts: a job runs a parse of each answer and a
# comparison, each under its own alarm, plus the pickling round trip. (The worker's
# start-up, which imports sympy, is not timed: pebble starts the clock at the job.)
_POOL_SLACK_S = 10.0

# How a problem's answer is graded, named by its data row's `answer_type` column:
# "math" (the default) accepts any expression equivalent to the gold answer, as math-verify
# judges; "number" accepts only a number equal to it, for problems whose task is to compute
# that number (arith), where an unevaluated expression must not earn the reward.
AnswerType = Literal["math", "number"]
ANSWER_TYPES: tuple[AnswerType, ...] = get_args(AnswerType)

# ----------------------------------------------------------------------------- fast path

# A matrix's row break `\\` is matched first and kept (`\1`): its second backslash and the
# space after it are not the `\ ` spacing macro, whose removal would join two rows.
_SPACING_RE = re.compile(r"(\\\\)|\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[!,;: ]|\\displaystyle")
# `\$36` is thirty-six dollars and a bare `$` a math delimiter: both go (`\$` first, as one token).
_CURRENCY_RE = re.compile(r"\\\$|\$")
_DEGREE_RE = re.compile(r"\^\{?\\circ\}?")
# A unit after a quantity (`5.4 \text{ cents}`, `15\mbox{ cm}^2`), as the MATH, Qwen2.5-Math and
# math-verify graders drop it; only when a digit precedes it, so `\text{Evelyn}` stays an answer.
_UNIT_RE = re.compile(r"(?<=\S)\s*\\(?:text|textbf|mbox)\{[^{}]*\}(?:\^\{?\d\}?)?\s*$")
# A bare `%` starts a LaTeX comment, which would hide everything after it from math-verify.
_BARE_PERCENT_RE = re.compile(r"(?<!\\)%")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_FRAC_RE = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)")
_LATEX_FRAC_RE = re.compile(r"([+-]?)\\frac\{([^{}]+)\}\{([^{}]+)\}")


def clean(answer: str) -> str:
    """`answer` without what never changes its value, still LaTeX (math-verify reads it).

    Removes math delimiters, currency signs, sizing and spacing macros (`\\!` of `1,\\!000`),
    degree signs and a unit after a quantity; spells `{,}` as `,`, `\\dfrac` as `\\frac` and
    `%` as `\\%`. Deliberately modest: digits, signs and decimal points are never touched, so
    `0.5` and `5` stay different.
    """
    s = _CURRENCY_RE.sub("", answer)
    s = _SPACING_RE.sub(r"\1", s)
    s = _DEGREE_RE.sub("", s)
    unitless = _UNIT_RE.sub("", s)
    if any(ch.isdigit() for ch in unitless):
        s = unitless
    s = _BARE_PERCENT_RE.sub(r"\\%", s.replace("{,}", ","))
    s = _FRAC_RE.sub(r"\\frac", s)
    return s.strip().rstrip(".").strip()


def normalize(answer: str) -> str:
    """A canonical spelling of `answer` for plain string comparison: `clean`, then
    `\\text{}` wrappers and all whitespace removed."""
    return "".join(_TEXT_RE.sub(r"\1", clean(answer)).split())


# Python refuses to read an int of more than 4,300 digits (CVE-2020-10735's limit); a
# longer run of digits is no answer anyone grades, so it is not read as a number at all.
MAX_NUMBER_CHARS = 4000


def _number(text: str) -> Fraction | None:
    """`text` (already normalized) as an exact number, or None if it is not a plain one.

    Understands `1,234.5`, `-0.25`, `3/4` and `\\frac{3}{4}` (numeric parts only).
    """
    if len(text) > MAX_NUMBER_CHARS:
        return None
    if _PLAIN_NUMBER_RE.fullmatch(text):
        return Fraction(text.replace(",", ""))
    frac = _LATEX_FRAC_RE.fullmatch(text)
    if frac:
        sign, num, den = frac.groups()
    elif text.count("/") == 1:
        sign, (num, den) = "", text.split("/")
    else:
        return None
    if not (_PLAIN_NUMBER_RE.fullmatch(num) and _PLAIN_NUMBER_RE.fullmatch(den)):
        return None
    den_value = Fraction(den.replace(",", ""))
    if den_value == 0:
        return None
    value = Fraction(num.replace(",", "")) / den_value
    return -value if sign == "-" else value


def written_number(answer: str) -> str:
    """The part of `answer` a `number` grade reads: normalized, and the right side of its
    last `=` (`83 + 31 = 114` reads as 114, as math-verify reads an equation)."""
    return normalize(answer).rsplit("=", 1)[-1]


def is_number(answer: str) -> bool:
    """Whether `answer` is written as a plain number (`1,234.5`, `-3/4`, `\\frac{3}{4}`,
    `17\\%`), the only spelling a `number` grade accepts."""
    return _number(_without_percent(written_number(answer))[0]) is not None


def _numbers_equal(a: Fraction, b: Fraction) -> bool:
    """Exact for integers (AIME-style 1000000 vs 1000001 must differ), else relative 1e-6."""
    if a == b:
        return True
    if a.denominator == 1 and b.denominator == 1:
        return False
    return abs(a - b) <= Fraction(1, 10**6) * max(abs(a), abs(b))


def _fast_verdict(pred: str, gold: str) -> bool | None:
    """True/False when decidable without sympy, None when math-verify must decide."""
    p, g = normalize(pred), normalize(gold)
    if not p:
        return False
    if p == g:
        return True
    # Two plain numbers are settled here: sympy would only reach the same verdict slower.
    return _numeric_verdict(p, g)


def _numeric_verdict(pred: str, gold: str) -> bool | None:
    """Compare two normalized plain numbers, either perhaps in percent; None if not numbers.

    With a percent sign on one side only, `17\\%` matches 17 (MATH's `is_equiv` drops the
    sign) and 0.17 (math-verify reads it as 17/100); with it on both, the numbers must agree.
    """
    p_text, p_percent = _without_percent(pred)
    g_text, g_percent = _without_percent(gold)
    p_num, g_num = _number(p_text), _number(g_text)
    if p_num is None or g_num is None:
        return None
    if p_percent == g_percent:
        return _numbers_equal(p_num, g_num)
    scaled = (p_num / 100, g_num) if p_percent else (p_num, g_num / 100)
    return _numbers_equal(p_num, g_num) or _numbers_equal(*scaled)


def _without_percent(text: str) -> tuple[str, bool]:
    """`text` without a trailing `\\%`, and whether it had one."""
    return (text[:-2], True) if text.endswith("\\%") else (text, False)


# ----------------------------------------------------------------------------- math-verify


class _DropTimeoutDisabledWarning(logging.Filter):
    """Hide math-verify's 'Timeout is disabled' warning: we disable it knowingly."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def _as_latex(answer: str) -> str:
    """Wrap a cleaned answer in `$...$` so math-verify's LaTeX extractor sees all of it."""
    if "\\boxed" in answer:
        return answer
    return f"${answer}$"


def _math_verify(pred: str, gold: str, timeout_s: int | None) -> bool:
    """math-verify's verdict in this thread; any failure (timeouts included) is False.

    `timeout_s=None` disables math-verify's alarms; only safe where nothing else works.
    """
    # Imported here so the fast path never pays for sympy.
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    try:
        gold_parsed = parse(_as_latex(gold), parsing_timeout=timeout_s)
        pred_parsed = parse(_as_latex(pred), parsing_timeout=timeout_s)
        if not gold_parsed or not pred_parsed:
            return False
        # Gold first: verify() is asymmetric (e.g. `x = 3` as a prediction matches gold 3).
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout_s))
    except (Exception, TimeoutException):  # TimeoutException is a BaseException
        log.debug("math-verify failed on pred=%r gold=%r", pred, gold, exc_info=True)
        return False


def _warm_worker() -> None:
    """Worker initializer: import sympy once, before the first job's clock runs out."""
    import math_verify  # noqa: F401


# One worker process shared by every thread, created lazily. pebble's pool restarts a
# worker that died or that it killed, and times each job from when the worker takes it
# (a job queued behind others is not timed out for waiting); the stdlib's
# ProcessPoolExecutor has neither, nor a public way to kill a stuck worker.
_pool: ProcessPool | None = None
_pool_pid: int | None = None
_pool_lock = threading.Lock()


def _get_pool() -> ProcessPool:
    """The verifier pool, created on first use (and anew in a forked child)."""
    global _pool, _pool_pid
    with _pool_lock:
        # A forked child inherits the parent's pool object but not its worker or threads.
        if _pool is None or _pool_pid != os.getpid() or not _pool.active:
            _pool = ProcessPool(
                max_workers=1,
                initializer=_warm_worker,
                context=multiprocessing.get_context("spawn"),
            )
            if _pool_pid != os.getpid():
                # Inside a multiprocessing child atexit never runs, and the child's exit
                # joins our (non-daemonic) worker: without this it would wait forever.
                multiprocessing.util.Finalize(None, shutdown_verifier_pool, exitpriority=100)
            _pool_pid = os.getpid()
        return _pool


def _verify_in_worker(pred: str, gold: str, timeout_s: int, timeout: float) -> bool:
    """Run `_math_verify` in the worker process; False if it outlives its alarms (pebble
    kills it and starts another) or dies on this job."""
    try:
        job = _get_pool().schedule(
            _math_verify, args=(pred, gold, timeout_s), timeout=timeout + _POOL_SLACK_S
        )
        return job.result()
    except TimeoutError:
        log.warning("math-verify worker stuck past its alarms; killed, scored as not equivalent")
    except ProcessExpired as err:
        log.warning("math-verify worker died (%s); scored as not equivalent", err)
    except (RuntimeError, CancelledError):
        # The pool refused or dropped the job: another thread (or the interpreter
        # exiting) is shutting it down. math-verify without alarms is all that is left.
        return _math_verify(pred, gold, None)
    return False


def is_equivalent(
    pred: str | None, gold: str, timeout: float = 5.0, answer_type: AnswerType = "math"
) -> bool:
    """Whether the predicted answer `pred` is mathematically equivalent to `gold`.

    Never raises and works from any thread; `timeout` (seconds) bounds each of
    math-verify's parsing/comparison steps. A missing or empty prediction is False.
    With `answer_type="number"` the prediction must also be *written* as a number:
    math-verify evaluates `36 \\times 15` to 540, which on a problem that asks for that
    product is the question echoed back, not an answer (see ANSWER_TYPES).
    """
    if pred is None:
        return False
    # Datasets hand over ints for GSM8K-style golds; accept them rather than raise.
    pred, gold = str(pred), str(gold)
    if answer_type == "number":
        return _numeric_verdict(written_number(pred), normalize(gold)) is True
    fast = _fast_verdict(pred, gold)
    if fast is not None:
        return fast
    # math-verify gets the cleaned forms too: `\$36` would otherwise reach it as `\36`.
    pred, gold = clean(pred), clean(gold)
    # signal.alarm takes whole seconds, and 0 would mean "no timeout".
    timeout_s = max(1, math.ceil(timeout))
    if threading.current_thread() is threading.main_thread():
        return _math_verify(pred, gold, timeout_s)
    if multiprocessing.current_process().daemon:
        # A daemonic process (a multiprocessing.Pool worker) may not start children, so
        # the only option left is math-verify in this thread without its alarms.
        return _math_verify(pred, gold, None)
    return _verify_in_worker(pred, gold, timeout_s, timeout)


def shutdown_verifier_pool() -> None:
    """Stop the worker process, if any (registered with atexit; safe to call twice)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None and _pool_pid == os.getpid():
        pool.stop()
        pool.join()


atexit.register(shutdown_verifier_pool)
