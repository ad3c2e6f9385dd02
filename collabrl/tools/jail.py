"""The child side of the sandbox: the script the sandboxed interpreter runs first.

`Sandbox` passes this file's *text* to `python -I -B -c`, so it runs standalone on
the standard library alone: nothing of collabrl needs to be importable inside the
sandbox. Its one argument is a JSON config; the untrusted code arrives on stdin.

In order, it: reads the code, (namespaces mode only) enters fresh namespaces and a
minimal root, sets the resource limits, gives up root for a throwaway uid, and
runs the code. Everything that must hold against the code happens before the code
runs, and nothing after it is trusted.
"""

import ctypes
import json
import linecache
import os
import resource
import signal
import sys
import traceback

# <sched.h>, <sys/mount.h> and <sys/prctl.h>; Python 3.11 has no os.unshare or os.mount.
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    """Turn a failed libc call into an OSError naming what was attempted."""
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def enter_namespaces(cfg: dict) -> None:
    """Move into new mount/pid/net/ipc/uts namespaces under a minimal chroot.

    Two forks: the first child is PID 1 of the new pid namespace (its end kills
    everything in it) and reaps orphans; the second runs the code as an ordinary
    process, which unlike a PID 1 can be killed by its own signals. Only that
    second child returns; the others wait and pass its exit on.
    """
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    check(libc.unshare(flags), "unshare")
    wait_unless_child(os.fork())
    # The caller kills our process group, which holds PID 1 too until the code calls
    # setsid; from then on this makes the waiting parent's death kill PID 1, and with
    # it the whole namespace.
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    build_root(cfg)
    wait_unless_child(os.fork())


def wait_unless_child(child: int) -> None:
    """In the parent of a fork: reap until `child` ends, then exit as bwrap does.

    A signal death becomes exit code 128+signal (PID 1 cannot kill itself with it).
    """
    if child == 0:
        return
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def build_root(cfg: dict) -> None:
    """Mount a tmpfs root holding read-only binds of what Python needs, and chroot."""
    root = cfg["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    size = f"size={cfg['disk_bytes']}"
    # /tmp first: binds under it (a venv in /tmp) must land on the tmpfs, not under it.
    os.makedirs(root + "/tmp")
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    for source in cfg["binds"]:
        target = root + source
        os.makedirs(target, mode=0o755, exist_ok=True)
        mount(source, target, None, MS_BIND | MS_REC)
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for name, dest in cfg["symlinks"].items():
        os.symlink(dest, root + name)
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.mkdir(root + "/dev")
    for device in ("null", "zero", "random", "urandom"):
        open(root + "/dev/" + device, "w").close()
        mount("/dev/" + device, root + "/dev/" + device, None, MS_BIND)
    os.makedirs(root + cfg["workdir"], exist_ok=True)
    mount("tmpfs", root + cfg["workdir"], "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0700")
    os.chroot(root)
    os.chdir("/")


def set_limits(cfg: dict) -> None:
    """Hard resource limits; soft == hard, so the code cannot raise them back."""
    # CPU: SIGXCPU at the soft limit ends Python; SIGKILL one second later is the backstop.
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    for name, value in (
        ("RLIMIT_AS", cfg["memory_bytes"]),
        ("RLIMIT_NOFILE", cfg["max_open_files"]),
        ("RLIMIT_NPROC", cfg["max_processes"]),
        ("RLIMIT_FSIZE", cfg["disk_bytes"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))


def drop_privileges(uid: int) -> None:
    """Become a throwaway uid with no groups and no capabilities.

    RLIMIT_NPROC never binds root, and a uid of its own per run means the code can
    neither signal nor share a process budget with anything else on the machine.
    """
    os.chown(".", uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def refuse_sockets(event: str, args: tuple) -> None:
    """Audit hook for the rlimits mode. A courtesy, not a boundary: ctypes gets past it."""
    if event == "socket.__new__":
        raise PermissionError("network access is disabled in this sandbox")


def main() -> None:
    cfg = json.loads(sys.argv[1])
    code = sys.stdin.read()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if cfg["mode"] == "namespaces":
        enter_namespaces(cfg)
    os.chdir(cfg["workdir"])
    set_limits(cfg)
    if cfg["uid"] is not None:
        drop_privileges(cfg["uid"])
    # Setuid binaries cannot hand privileges back (bwrap sets this flag itself).
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
    if cfg["block_sockets"]:
        sys.addaudithook(refuse_sockets)
    sys.argv = ["<code>"]
    # Tracebacks then quote the offending lines, which is what the model needs to read.
    linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
    try:
        exec(compile(code, "<code>", "exec"), {"__name__": "__main__"})
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - report it as Python would, minus this frame
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        sys.exit(1)


if __name__ == "__main__":
    main()
