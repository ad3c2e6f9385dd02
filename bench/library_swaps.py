"""Hand code against the libraries that replaced it (issue 52.8), side by side in one run.

- **verifier worker**: math-verify jobs from four threads through the stdlib's
  `ProcessPoolExecutor` (one spawned worker, as `rewards/verify.py` had it) against
  pebble's `ProcessPool` (what it has now), and the time from a stuck job's timeout to
  the next answer (kill the worker, start another, import sympy again);
- **sandbox**: the scan for a run's live processes, a glob over /proc/*/status (before)
  against `psutil.process_iter` (now), alone and inside whole `Sandbox.run`s;
- **response cache**: one entry replaced through `mkstemp` + `os.replace` (before)
  against `runs.write_atomic` unsynced (now) and synced (what `durable=False` saves).

Rounds interleave the two sides of each pair; medians are reported, with the ratio
now / before (below 1: the library is faster).

    python bench/library_swaps.py                      # 5 rounds
    python bench/library_swaps.py --rounds 1 --jobs 2 --sandbox-runs 1    # smoke
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pebble import ProcessPool  # noqa: E402

from collabrl import runs  # noqa: E402
from collabrl.rewards import verify  # noqa: E402
from collabrl.tools import sandbox  # noqa: E402

# Pairs math-verify must decide (none is settled by the fast path).
HARD = [
    (r"(3, \frac{\pi}{2})", r"\left( 3, \frac{\pi}{2} \right)"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    ("x^2+2x+1", "(x+1)^2"),
    (r"\sin^2 x + \cos^2 x", "1"),
    (r"\{1,2\}", r"\{2,1\}"),
    (r"\frac{\pi}{3}", r"60^\circ"),
]
SPAWN = multiprocessing.get_context("spawn")


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _row(name: str, before: list[float], now: list[float], unit: str, scale: float) -> None:
    b, n = _median(before) * scale, _median(now) * scale
    print(f"{name:<34} {b:10.3f} {unit:<3} {n:10.3f} {unit:<3} ratio {n / b:.3f}x")


# -- verifier worker ----------------------------------------------------------------


def _stdlib_pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(1, mp_context=SPAWN, initializer=verify._warm_worker)


def _pebble_pool() -> ProcessPool:
    return ProcessPool(1, initializer=verify._warm_worker, context=SPAWN)


def _jobs_stdlib(pool: ProcessPoolExecutor, jobs: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as threads:
        calls = [(p, g, 5) for p, g in (HARD * jobs)[:jobs]]
        list(threads.map(lambda c: pool.submit(verify._math_verify, *c).result(), calls))
    return time.perf_counter() - started


def _jobs_pebble(pool: ProcessPool, jobs: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as threads:
        calls = [(p, g, 5) for p, g in (HARD * jobs)[:jobs]]
        list(
            threads.map(
                lambda c: pool.schedule(verify._math_verify, args=c, timeout=15).result(), calls
            )
        )
    return time.perf_counter() - started


def _recover_stdlib(pool: ProcessPoolExecutor) -> tuple[float, ProcessPoolExecutor]:
    """As rewards/verify.py did: wait out the job, kill the worker through the executor's
    private `_processes`, make a new pool; timed to the next answer."""
    stuck = pool.submit(time.sleep, 60)
    try:
        stuck.result(timeout=0.5)
    except FuturesTimeout:
        started = time.perf_counter()
        for proc in list(pool._processes.values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        pool = _stdlib_pool()
        pool.submit(verify._math_verify, *HARD[0], 5).result()
    return time.perf_counter() - started, pool


def _recover_pebble(pool: ProcessPool) -> float:
    """pebble times the job out, kills the worker and starts another by itself."""
    stuck = pool.schedule(time.sleep, args=(60,), timeout=0.5)
    try:
        stuck.result()
    except TimeoutError:
        started = time.perf_counter()
        pool.schedule(verify._math_verify, args=(*HARD[0], 5), timeout=15).result()
    return time.perf_counter() - started


def bench_verifier(rounds: int, jobs: int) -> None:
    stdlib, pebble = _stdlib_pool(), _pebble_pool()
    # Untimed warm-up: both workers started, sympy imported.
    _jobs_stdlib(stdlib, 1)
    _jobs_pebble(pebble, 1)
    times: dict[str, list[float]] = {"jobs_b": [], "jobs_n": [], "rec_b": [], "rec_n": []}
    for _ in range(rounds):
        times["jobs_b"].append(_jobs_stdlib(stdlib, jobs) / jobs)
        times["jobs_n"].append(_jobs_pebble(pebble, jobs) / jobs)
        seconds, stdlib = _recover_stdlib(stdlib)
        times["rec_b"].append(seconds)
        times["rec_n"].append(_recover_pebble(pebble))
    stdlib.shutdown()
    pebble.stop()
    pebble.join()
    _row("verifier: per job, 4 threads", times["jobs_b"], times["jobs_n"], "ms", 1e3)
    _row("verifier: stuck job to next answer", times["rec_b"], times["rec_n"], "s", 1)


# -- sandbox --------------------------------------------------------------------------


def _live_by_hand(uid: int) -> list[int]:
    """The scan sandbox.py had before psutil: every /proc/<pid>/status read and split."""
    live = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            continue
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            live.append(int(status.parent.name))
    return live


def _time(call: Callable[[], object], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - started) / repeat


def bench_sandbox(rounds: int, runs_per_round: int) -> None:
    uid = sandbox._throwaway_uid()  # what a run scans for: every process is read
    by_psutil = sandbox._live_processes
    scan_b, scan_n, run_b, run_n = [], [], [], []
    box = sandbox.Sandbox()
    processes = len(list(Path("/proc").glob("[0-9]*")))
    for _ in range(rounds):
        scan_b.append(_time(lambda: _live_by_hand(uid), 50))
        scan_n.append(_time(lambda: by_psutil(uid), 50))
        for scan, times in ((_live_by_hand, run_b), (by_psutil, run_n)):
            sandbox._live_processes = scan
            times.append(_time(lambda: box.run("print(1)"), runs_per_round))
    sandbox._live_processes = by_psutil
    _row(f"sandbox: one scan ({processes} processes)", scan_b, scan_n, "ms", 1e3)
    _row(f"sandbox: run print(1) ({box.isolation})", run_b, run_n, "ms", 1e3)


# -- response cache -------------------------------------------------------------------


def _put_by_hand(path: Path, entry: dict) -> None:
    """ResponseCache.put before: mkstemp beside the entry, json.dump, os.replace."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(entry, f, ensure_ascii=False)
    os.replace(tmp, path)


def bench_cache(rounds: int) -> None:
    entry = {"text": "The answer is 42. " * 40, "completion_tokens": 320, "finish": "stop"}
    before, now, synced = [], [], []
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as folder:  # the disk runs write to
        path = Path(folder) / "ab" / "entry.json"
        path.parent.mkdir()
        for _ in range(rounds):
            before.append(_time(lambda: _put_by_hand(path, entry), 200))
            now.append(
                _time(lambda: runs.write_atomic(path, json.dumps(entry), durable=False), 200)
            )
            synced.append(_time(lambda: runs.write_atomic(path, json.dumps(entry)), 20))
    _row("cache: put one entry", before, now, "ms", 1e3)
    _row("cache: synced, unsynced (durable=)", synced, now, "ms", 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=24, help="verifier jobs per round")
    parser.add_argument("--sandbox-runs", type=int, default=5, help="sandbox runs per round")
    args = parser.parse_args()
    print("command: python " + shlex.join(sys.argv))
    print(f"{'':<34} {'before':>14} {'now':>14}")
    bench_verifier(args.rounds, args.jobs)
    bench_sandbox(args.rounds, args.sandbox_runs)
    bench_cache(args.rounds)


if __name__ == "__main__":
    main()
