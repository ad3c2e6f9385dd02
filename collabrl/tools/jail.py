"""The child side of the sandbox: the script the sandboxed interpreter runs first.

`Sandbox` passes this file's *text* to `python -I -B -c`, so it runs standalone on
the standard library alone: nothing of collabrl needs to be importable inside the
sandbox. Its one argument is a JSON config; the untrusted code arrives on stdin.

In order, it: refuses a machine its seccomp filter has no table for, reads the code,
(namespaces mode only) enters fresh namespaces and a minimal root, keeps a read-only
copy of the code for multiprocessing, caps the inodes of its tmpfs mounts, sets the
resource limits, joins a fresh session keyring, gives up root for a throwaway uid,
installs a seccomp filter, and runs the code. Everything that must hold against the
code happens before the code runs, and nothing after it is trusted.
"""

import ctypes
import errno
import json
import linecache
import os
import resource
import signal
import struct
import sys
import traceback
import types

# <sched.h>, <sys/mount.h> and <sys/prctl.h>; Python 3.11 has no os.unshare or os.mount.
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
CLONE_NEWUSER = 0x10000000

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    """Turn a failed libc call into an OSError naming what was attempted."""
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def enter_namespaces(cfg: dict, code_bytes: int) -> None:
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
    build_root(cfg, code_bytes)
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


def build_root(cfg: dict, code_bytes: int) -> None:
    """Mount a tmpfs root holding read-only binds of what Python needs, and chroot.

    The root has room for its directories and for the copy of the code (`keep_code`).
    """
    root = cfg["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    room = (1 << 20) + code_bytes
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={room},mode=0755")
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
    os.mkdir(root + "/dev/shm")  # POSIX semaphores and shared memory (multiprocessing)
    mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    os.makedirs(root + cfg["workdir"], exist_ok=True)
    mount("tmpfs", root + cfg["workdir"], "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0700")
    os.chroot(root)
    os.chdir("/")


def cap_inodes(cfg: dict) -> None:
    """Cap the files of each writable tmpfs: `size=` bounds their bytes, not their count,
    and empty files cost kernel memory outside every limit (~1 KB each with the dentry).

    Done by remount so that the same code serves the tmpfs bwrap made and ours.
    """
    for target in cfg["tmpfs"]:
        options = f"size={cfg['disk_bytes']},nr_inodes={cfg['disk_inodes']}"
        mount(None, target, None, MS_REMOUNT | MS_NOSUID | MS_NODEV, options)


def volunteer_for_oom_killer() -> None:
    """Make the run the OOM killer's first pick, so that it, and not the trainer, dies.

    Memory is capped per process, not per run (docs/tools.md), and tmpfs pages sit
    outside RLIMIT_AS. Written while root, this also raises the floor the code could
    lower it back to (the kernel's oom_score_adj_min).
    """
    # By hand: the jail runs on the standard library alone (module docstring), and
    # psutil has no setter for oom_score_adj anyway.
    with open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("1000")


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
        # No POSIX message queue: the filter denies mq_open, and this is the second wall.
        ("RLIMIT_MSGQUEUE", 0),
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


# seccomp: <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>. The machines (`uname -m`)
# the filter has a syscall table for, and the AUDIT_ARCH the kernel reports for their
# native calls. Every mode promises the filter, so on any other machine no code runs.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
MACHINES = tuple(AUDIT_ARCH)  # the column of each machine in the tables below
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI shares its AUDIT_ARCH
SECCOMP_MODE_FILTER, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 2, 0x7FFF0000, 0x00050000
LD_ABS_W, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
# struct seccomp_data; both machines are little-endian, so an argument's low 32 bits,
# all that the kernel reads of an int such as a socket family or clone's flags, come first.
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16
AF_UNIX = 1
# Syscall numbers as (x86_64, aarch64): <asm/unistd_64.h>, and <asm-generic/unistd.h>,
# which aarch64 uses. First those the filter does not simply deny:
CHECKED = {
    # Their flags (arg0) must not hold CLONE_NEWUSER.
    "clone": (56, 220), "unshare": (272, 97),
    # Their family (arg0) must be AF_UNIX.
    "socket": (41, 198), "socketpair": (53, 199),
    # clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall
    # back to clone, whose flags it can.
    "clone3": (435, 435),
}  # fmt: skip
# Denied outright with EPERM (the code reads an OSError), by reason:
DENIED = {
    # Keyrings are shared with the caller's session and live on after the run.
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    # io_uring: a large kernel surface, and its requests bypass seccomp.
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    # RAM outside RLIMIT_AS and outside the tmpfs sizes; no maths library needs them
    # (multiprocessing uses POSIX shm on /dev/shm, a sized tmpfs, and futexes). In the
    # rlimits mode System V IPC and message queues would also outlive the run in the
    # host's IPC namespace, readable by the next run.
    "memfd_create": (319, 279), "memfd_secret": (447, 447),
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197),
    "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183), "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    # userfaultfd holds a kernel page fault for as long as the code likes, the usual
    # way to win a race in the kernel; perf_event_open is a large surface and a side
    # channel on whatever shares the CPU. No maths code needs either.
    "userfaultfd": (323, 282), "perf_event_open": (298, 241),
}  # fmt: skip


def syscall_numbers(machine: str) -> dict[str, int]:
    """Each syscall of the tables above by name, numbered for `machine`."""
    column = MACHINES.index(machine)
    return {name: numbers[column] for name, numbers in (CHECKED | DENIED).items()}


def refuse_unknown_machine(machine: str) -> None:
    """Stop before any code runs where the filter has no table: every mode promises it."""
    if machine not in AUDIT_ARCH:
        raise SystemExit(
            f"the sandbox's seccomp filter has no syscall table for {machine} "
            f"(it has {', '.join(MACHINES)}); it runs no code without the filter"
        )


# <linux/keyctl.h>: join a new anonymous session keyring.
KEYCTL_JOIN_SESSION_KEYRING = 1


def new_session_keyring(machine: str) -> None:
    """Leave the caller's session keyring for a fresh, empty one of this run's own.

    Joined as root, before the uid change, so the keyring is charged to root and not
    to the throwaway uid (whose kernel-side key user would outlive the run). The
    seccomp filter then denies every keyring call, so this is the second wall.
    """
    joined = libc.syscall(
        ctypes.c_long(syscall_numbers(machine)["keyctl"]),
        ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
        None,
    )
    # A kernel without keys (ENOSYS) or an outer filter (EPERM, as Docker's) leaves
    # nothing reachable to leave behind.
    if joined < 0 and ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM):
        check(joined, "keyctl(JOIN_SESSION_KEYRING)")


def seccomp_filter(machine: str) -> bytes:
    """A classic-BPF program for `machine`: deny `DENIED`, user namespaces, clone3 and
    every socket family but AF_UNIX; allow the rest.

    Calls of another ABI (i386 `int 0x80` and x32 on x86_64, arm32 on aarch64) get
    ENOSYS: their numbers differ, so checking only the native numbers would let them by.
    """

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("<HBBI", code, jt, jf, k)

    nr = syscall_numbers(machine)
    enosys, eperm = SECCOMP_RET_ERRNO | errno.ENOSYS, SECCOMP_RET_ERRNO | errno.EPERM
    program = [
        op(LD_ABS_W, OFFSET_ARCH),
        op(JEQ, AUDIT_ARCH[machine], jt=1),
        op(RET, enosys),
        op(LD_ABS_W, OFFSET_NR),
    ]
    if machine == "x86_64":
        program += [op(JGE, X32_SYSCALL_BIT, jf=1), op(RET, enosys)]
    program += [
        op(JEQ, nr["clone3"], jf=1),
        op(RET, enosys),
        op(JEQ, nr["clone"], jt=1),
        op(JEQ, nr["unshare"], jf=4),
        op(LD_ABS_W, OFFSET_ARG0),
        op(JSET, CLONE_NEWUSER, jf=1),
        op(RET, eperm),
        op(RET, SECCOMP_RET_ALLOW),
        # An allow-list, so that a family this table never heard of (AF_VSOCK reaches
        # the hypervisor, AF_NETLINK the kernel) stays closed. multiprocessing needs
        # AF_UNIX; in the jails its abstract names are the jail's own.
        op(JEQ, nr["socket"], jt=1),
        op(JEQ, nr["socketpair"], jf=4),
        op(LD_ABS_W, OFFSET_ARG0),
        op(JEQ, AF_UNIX, jf=1),
        op(RET, SECCOMP_RET_ALLOW),
        op(RET, eperm),
    ]
    for name in DENIED:
        program += [op(JEQ, nr[name], jf=1), op(RET, eperm)]
    program.append(op(RET, SECCOMP_RET_ALLOW))
    return b"".join(program)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install_seccomp(machine: str) -> None:
    """Load `seccomp_filter` for this process and all it starts (needs no_new_privs)."""
    program = seccomp_filter(machine)
    fprog = SockFprog(len(program) // 8, program)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def keep_code(path: str, code: str, uid: int | None) -> None:
    """Write the code to `path`, read-only, for multiprocessing's spawned children.

    A child of the spawn or forkserver start method is a fresh interpreter that
    rebuilds __main__ by running the file __main__.__file__ names; without one it
    cannot unpickle the code's functions. `path` is in a directory only the jail
    writes, and, as root, readable by the run's uid alone (its group).
    """
    with open(path, "xb") as file:  # "x": a fresh file, no link to follow
        file.write(code.encode(errors="surrogateescape"))  # as stdin decoded it
    if uid is not None:
        os.chown(path, 0, uid)
    os.chmod(path, 0o440)


def main() -> None:
    machine = os.uname().machine
    refuse_unknown_machine(machine)
    cfg = json.loads(sys.argv[1])
    code = sys.stdin.read()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if cfg["mode"] == "namespaces":
        enter_namespaces(cfg, len(code.encode(errors="surrogateescape")))
    os.chdir(cfg["workdir"])
    keep_code(cfg["code_path"], code, cfg["uid"])
    cap_inodes(cfg)
    volunteer_for_oom_killer()
    set_limits(cfg)
    new_session_keyring(machine)
    if cfg["uid"] is not None:
        drop_privileges(cfg["uid"])
    # Setuid binaries cannot hand privileges back (bwrap sets this flag itself).
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
    install_seccomp(machine)
    sys.argv = ["<code>"]
    # Tracebacks then quote the offending lines, which is what the model needs to read.
    linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
    # A real __main__ module, so that pickle (multiprocessing) finds the code's functions.
    sys.modules["__main__"] = main_module = types.ModuleType("__main__")
    main_module.__file__ = cfg["code_path"]  # what spawned children run to rebuild it
    try:
        exec(compile(code, "<code>", "exec"), main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - report it as Python would, minus this frame
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        sys.exit(1)


if __name__ == "__main__":
    main()
