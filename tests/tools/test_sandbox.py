"""The sandbox runs ordinary code well: libraries, output, exit codes, threads, limits."""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from collabrl.errors import UserError
from collabrl.tools import sandbox as sandbox_module
from collabrl.tools.sandbox import Execution, Sandbox, SandboxLimits, _limit_from_end

FAST = SandboxLimits(cpu_seconds=5, wall_seconds=10, memory_mb=2048)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(FAST)


def test_math_libraries_import_and_compute(sandbox):
    code = (
        "import cmath, fractions, itertools, math\n"
        "import numpy, scipy.optimize, sympy\n"
        "x = sympy.Symbol('x')\n"
        "print(sympy.solve(x**2 - 4, x), int(numpy.arange(5).sum()))\n"
        "print(round(scipy.optimize.brentq(lambda t: t**3 - 2, 0, 2), 6))\n"
        "print(fractions.Fraction(1, 3) * 3, math.comb(5, 2), cmath.sqrt(-1))\n"
        "print(len(list(itertools.permutations(range(4)))))"
    )
    result = sandbox.run(code)
    assert result.ok, result
    assert result.stdout.splitlines() == ["[-2, 2] 10", "1.259921", "1 10 1j", "24"]


def test_multiprocessing_pools_and_locks_work(sandbox):
    # A pool pickles the code's functions by name from __main__, and its locks are
    # POSIX semaphores on /dev/shm: both must exist inside the jail.
    code = (
        "import multiprocessing\n"
        "def square(x):\n    return x * x\n"
        "with multiprocessing.Pool(2) as pool:\n    print(pool.map(square, range(4)))\n"
        "print(multiprocessing.Value('i', 7).value)"
    )
    result = sandbox.run(code)
    assert result.ok, result
    assert result.stdout == "[0, 1, 4, 9]\n7\n"


def test_stdout_stderr_and_exit_code(sandbox):
    result = sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert not result.ok and result.error_type == "exit_code"


def test_exception_is_named_and_traceback_quotes_the_code(sandbox):
    result = sandbox.run("x = 1\nprint(undefined_name)")
    assert result.error_type == "NameError"
    assert "line 2" in result.stderr and "print(undefined_name)" in result.stderr
    assert "jail" not in result.stderr  # the jail's own frame is cut from the traceback


def test_environment_is_built_from_scratch(sandbox, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-sentinel")
    result = sandbox.run("import os\nprint(sorted(os.environ), os.environ['OMP_NUM_THREADS'])")
    assert result.ok, result
    assert "OPENAI_API_KEY" not in result.stdout and result.stdout.endswith(" 1\n")


def test_each_run_gets_a_fresh_writable_directory(sandbox):
    first = sandbox.run("open('note.txt', 'w').write('hi')\nimport os\nprint(os.listdir('.'))")
    second = sandbox.run("import os\nprint(os.listdir('.'))")
    assert first.stdout == "['note.txt']\n" and second.stdout == "[]\n"


def test_collabrl_is_not_reachable_inside(sandbox):
    if sandbox.isolation == "rlimits":
        pytest.skip("rlimits mode does not hide the host's files")
    result = sandbox.run("import collabrl.config")  # the repo's sources are not bound
    assert result.error_type == "ModuleNotFoundError"


def test_concurrent_runs_from_threads(sandbox):
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(sandbox.run, [f"print({i} * {i})" for i in range(8)]))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]


def test_output_over_the_cap_is_truncated_with_a_marker():
    limits = SandboxLimits(max_output_bytes=1000, wall_seconds=10)
    result = Sandbox(limits).run("print('y' * 5000)")
    assert result.limit == "output" and result.error_type == "output"
    assert len(result.stdout) <= 1000 and "[output truncated at 1000 bytes]" in result.stderr


def test_wall_time_is_enforced():
    result = Sandbox(SandboxLimits(wall_seconds=1)).run("import time\ntime.sleep(30)")
    assert result.limit == "wall_time" and result.duration_s < 5


@pytest.mark.parametrize(
    "kwargs", [{"isolation": "chroot"}, {"cpu_seconds": 0}, {"max_output_bytes": -1}]
)
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(UserError):
        Sandbox(SandboxLimits(**kwargs))


def test_unusable_interpreter_is_refused():
    with pytest.raises(UserError):
        Sandbox(SandboxLimits(isolation="rlimits"), python="/nonexistent/python")


@pytest.mark.parametrize(
    "stderr,exit_code,expected",
    [
        (
            "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n",
            1,
            "ZeroDivisionError",
        ),
        ("Traceback ...\nsympy.core.sympify.SympifyError: bad\n", 1, "SympifyError"),
        ("", -11, "signal 11"),
        ("", 2, "exit_code"),
    ],
)
def test_error_type_reads_the_last_traceback_line(stderr, exit_code, expected):
    result = Execution("", stderr, exit_code, None, "bwrap", 0.1)
    assert result.error_type == expected


# A fork bomb's children write their tracebacks at once: the last line of stderr is
# another child's source line, not the exception (seen in CI).
INTERLEAVED = (
    "Traceback (most recent call last):\nTraceback (most recent call last):\n"
    '  File "<code>", line 3, in <module>\n'
    "BlockingIOError: [Errno 11] Resource temporarily unavailable\n"
    '  File "<code>", line 3, in <module>\n    os.fork()\n'
)


def test_interleaved_tracebacks_still_name_the_limit_and_the_exception():
    assert _limit_from_end(1, INTERLEAVED.encode(), 0.1, SandboxLimits()) == "processes"
    assert Execution("", INTERLEAVED, 1, None, "bwrap", 0.1).error_type == "BlockingIOError"


def test_an_interpreter_whose_prefix_is_under_tmp_still_sees_its_packages(tmp_path):
    # The jails mount a private /tmp: a venv living under /tmp (CI clones there) must be
    # bound on top of it, not hidden beneath it.
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python3*/site-packages")
    (site / "marker_module.py").write_text("VALUE = 42\n")
    result = Sandbox(FAST, python=str(venv / "bin" / "python")).run(
        "import marker_module\nprint(marker_module.VALUE)"
    )
    assert result.ok and result.stdout == "42\n", result


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another uid needs root")
def test_a_killed_process_counts_as_gone_once_it_is_a_zombie():
    uid = sandbox_module._throwaway_uid()
    proc = subprocess.Popen(["sleep", "30"], user=uid, group=uid, extra_groups=[])
    try:
        assert sandbox_module._live_processes(uid) == [proc.pid]
        os.kill(proc.pid, signal.SIGKILL)
        sandbox_module._wait_until_gone(uid)
        assert sandbox_module._live_processes(uid) == []  # a zombie, not yet reaped by us
    finally:
        proc.kill()
        proc.wait()
