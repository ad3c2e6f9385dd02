"""Equivalence checking, above all: same verdicts off the main thread as on it."""

import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context

import pytest
from pebble import ProcessExpired

from collabrl.rewards import verify as verify_mod
from collabrl.rewards.verify import clean, is_equivalent, is_number, normalize

# (pred, gold, expected). Several need sympy (not the fast path): `needs_sympy` below checks.
CASES: list[tuple[str | None, str, bool]] = [
    (r"\frac{1}{2}", "0.5", True),
    (r"\frac{14}{3}", "14/3", True),
    (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)", True),
    ("204", "204.0", True),
    ("1,000", "1000", True),
    ("5", "6", False),
    (None, "6", False),
    ("", "6", False),
    (r"\frac{1}{2}", r"\dfrac{2}{4}", True),
    (r"\sqrt{4}", "2", True),
    (r"2\sqrt{2}", r"\sqrt{8}", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("(x+1)^3", "(x+1)^2", False),
    (r"\frac{\pi}{3}", r"60^\circ", False),
    (r"\{1,2\}", r"\{2,1\}", True),
    ("[1,2)", "[1,2]", False),
    (r"\sqrt{3}", r"\sqrt{2}", False),
    (r"\pi", r"\pi", True),
    (r"2\pi", r"\pi", False),
    (r"\infty", r"\infty", True),
    (r"\frac{3}{4}", r"0.75", True),
    (r"\sin^2 x + \cos^2 x", "1", True),
]


def needs_sympy(pred: str | None, gold: str) -> bool:
    return pred is not None and verify_mod._fast_verdict(pred, gold) is None


def test_cases_include_sympy_ones() -> None:
    # The thread test below is only meaningful if math-verify really runs.
    assert sum(needs_sympy(p, g) for p, g, _ in CASES) >= 8


@pytest.mark.parametrize("pred, gold, expected", CASES)
def test_main_thread(pred: str | None, gold: str, expected: bool) -> None:
    assert threading.current_thread() is threading.main_thread()
    assert is_equivalent(pred, gold) is expected


def test_worker_threads_match_main_thread() -> None:
    """The regression this module exists for: signal.alarm must not zero rewards in threads."""
    main = [is_equivalent(p, g) for p, g, _ in CASES]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(lambda case: is_equivalent(case[0], case[1]), CASES))
    expected = [e for _, _, e in CASES]
    assert threaded == expected
    assert threaded == main
    assert verify_mod._pool is not None  # the hard cases really went to the worker process


def test_timeout_in_thread_returns_false() -> None:
    # 10^(10^10) cannot be evaluated; math-verify's alarm must end it in the worker.
    with ThreadPoolExecutor(max_workers=1) as pool:
        result = pool.submit(is_equivalent, "10^{10^{10}}", "1", 1.0).result()
    assert result is False
    # The worker survives (or is replaced) and keeps answering.
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(is_equivalent, r"\sqrt{9}", "3").result() is True


def test_stuck_worker_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    # Make the pool give up almost at once, as if the worker hung past its alarms.
    monkeypatch.setattr(verify_mod, "_POOL_SLACK_S", -0.99)
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(is_equivalent, "10^{10^{10}}", "1", 1.0).result() is False
    monkeypatch.undo()
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(is_equivalent, r"\sqrt{25}", "5").result() is True


def test_a_dead_worker_is_restarted() -> None:
    """A worker that dies (here: exits mid-job) costs that job alone; the next is answered."""
    verify_mod.shutdown_verifier_pool()
    pool = verify_mod._get_pool()
    with pytest.raises(ProcessExpired):
        pool.schedule(os._exit, args=(1,)).result()
    with ThreadPoolExecutor(max_workers=1) as threads:
        assert threads.submit(is_equivalent, r"\sqrt{16}", "4").result() is True
    assert verify_mod._pool is pool  # the same pool, with a fresh worker


def test_a_job_waiting_behind_another_is_not_timed_out() -> None:
    """Jobs queue for the one worker: each is timed from when it starts, so four slow
    ones from four threads all finish, none killed for its wait."""
    verify_mod.shutdown_verifier_pool()
    pool = verify_mod._get_pool()
    jobs = [pool.schedule(time.sleep, args=(0.6,), timeout=1.0) for _ in range(4)]
    assert [job.result() for job in jobs] == [None] * 4


def _check_in_child() -> tuple[bool, bool]:
    """Run in a child process: once on its main thread, once on a thread of its own.

    No explicit shutdown: the child must still exit (atexit does not run in children).
    """
    direct = is_equivalent(r"\sqrt{4}", "2")
    with ThreadPoolExecutor(max_workers=1) as pool:
        threaded = pool.submit(is_equivalent, r"\sqrt{9}", "3").result()
    return direct, threaded


def _report_from_child(queue) -> None:
    queue.put(_check_in_child())


@pytest.mark.timeout(120)
def test_inside_process_pool_child() -> None:
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        assert pool.submit(_check_in_child).result(timeout=60) == (True, True)


@pytest.mark.timeout(120)
def test_child_process_exits_after_threaded_verify() -> None:
    ctx = get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_report_from_child, args=(queue,))
    proc.start()
    assert queue.get(timeout=60) == (True, True)
    proc.join(timeout=30)
    assert proc.exitcode == 0  # None would mean it hung joining the verifier worker


@pytest.mark.timeout(120)
def test_inside_daemonic_pool_worker() -> None:
    # multiprocessing.Pool workers are daemonic and may not start the verifier process.
    with get_context("spawn").Pool(1) as pool:
        assert pool.apply_async(_check_in_child).get(timeout=60) == (True, True)


def test_normalize() -> None:
    assert normalize(r"$\left( 3, \dfrac{\pi}{2} \right).$") == r"(3,\frac{\pi}{2})"
    assert normalize(r"90^{\circ}") == normalize(r"90^\circ") == "90"
    assert normalize(r"5\text{ cm}") == "5"  # a unit after a quantity goes
    assert normalize(r"\text{Evelyn}") == "Evelyn"  # a word answer stays
    assert normalize(r"\$1,\!000") == "1,000"  # `\$` is currency, not `\` + delimiter


def test_clean_keeps_a_matrix_row_break() -> None:
    """`\\\\ 3` is a row break then 3, not `\\` + the `\\ ` spacing macro."""
    matrix = r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"
    assert clean(matrix) == matrix
    assert clean(r"x \\\, y") == r"x \\ y"  # a thin space after a row break still goes


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("1000001", "1000000", False),  # integers compare exactly
        ("0.3333333", r"\frac{1}{3}", True),  # within relative 1e-6
        ("0.33", "1/3", False),
        ("-\\frac{3}{4}", "-0.75", True),
        ("3/0", "3/0", True),  # equal strings, even if meaningless
        ("12", 12, True),  # an int gold from a dataset
    ],
)
def test_numeric_fast_path(pred: str, gold: str, expected: bool) -> None:
    assert verify_mod._fast_verdict(str(pred), str(gold)) is expected
    assert is_equivalent(pred, gold) is expected


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("540", "540", True),
        ("540.0", "540", True),
        ("1,234", "1234", True),
        (r"\frac{3}{4}", "0.75", True),
        ("-17", "-17", True),
        ("83 + 31 = 114", "114", True),  # the right side of an equation, as math-verify reads it
        ("x = 7", "7", True),
        (r"36 \times 15", "540", False),  # the question echoed back: math-verify's 540
        ("36 × 15", "540", False),
        ("8 + 6", "14", False),
        (r"2^{3}", "8", False),
        ("114 = 83 + 31", "114", False),
        ("541", "540", False),
        ("", "540", False),
        (None, "540", False),
    ],
)
def test_a_number_answer_must_be_written_as_that_number(
    pred: str | None, gold: str, expected: bool
) -> None:
    assert is_equivalent(pred, gold, answer_type="number") is expected


def test_the_math_answer_type_accepts_what_math_verify_evaluates() -> None:
    """The default rule is unchanged: an equivalent expression is right."""
    assert is_equivalent(r"36 \times 15", "540") is True
    assert is_equivalent("8 + 6", "14") is True


@pytest.mark.parametrize("answer_type", ["math", "number"])
@pytest.mark.parametrize(
    "huge",
    [
        "1" * 5000,
        "1" * 5000 + ".5",
        "-" + "9" * 4400 + "/7",
        "\\frac{" + "1" * 5000 + "}{2}",
        "1/" + "3" * 4500,
        "1" * 5000 + "\\%",
    ],  # fmt: skip
)
def test_a_number_past_pythons_digit_limit_is_false_not_an_error(huge: str, answer_type) -> None:
    """A policy can write any number of digits; the grader says False, never raises."""
    assert is_equivalent(huge, "5", answer_type=answer_type) is False
    assert is_equivalent("5", huge, answer_type=answer_type) is False
    assert is_number(huge) is False
