"""The jail's seccomp filter, read as the kernel reads it, for every machine it covers.

Hostile snippets (test_hostile_jail.py) prove the filter on this machine's kernel.
Here each program is run by a small classic-BPF interpreter over synthetic
`seccomp_data`, for x86_64 and aarch64 alike, with syscall numbers taken from the
kernel's own headers, not from jail.py; and a machine the filter has no table for
must stop every mode before any code runs.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from collabrl.tools import jail
from collabrl.tools.sandbox import JAIL
from tests.tools.test_hostile import MODE_PAIRS

# <linux/bpf_common.h>: the only instructions a filter of ours may hold.
LD_W_ABS, JMP_JEQ_K, JMP_JGE_K, JMP_JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
BPF_MAXINSNS = 4096
# <linux/seccomp.h>, <linux/audit.h>
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
FOREIGN_ARCHES = {"i386": 0x40000003, "arm": 0x40000028, "riscv64": 0xC00000F3}

HEADERS = {  # <asm/unistd.h> of each machine; aarch64 uses the generic table
    "x86_64": ["/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h"],
    "aarch64": ["/usr/include/asm-generic/unistd.h"],
}
# What the filter must deny with EPERM, on every machine alike.
DENIED = [
    "add_key", "request_key", "keyctl",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "memfd_create", "memfd_secret",
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop",
    "msgget", "msgsnd", "msgrcv", "msgctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "userfaultfd", "perf_event_open",
]  # fmt: skip
# What Python, numpy and multiprocessing need, which must stay open.
ALLOWED = ["read", "write", "openat", "close", "mmap", "futex", "wait4", "exit_group", "getpid"]
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 1, 2, 10, 16, 17
AF_BLUETOOTH, AF_ALG, AF_VSOCK, AF_XDP = 31, 38, 40, 44
CLONE_NEWNS, CLONE_NEWUSER, SIGCHLD = 0x20000, 0x10000000, 17


def syscall_table(machine: str) -> dict[str, int]:
    """Syscall numbers of `machine` from the installed kernel headers."""
    for header in HEADERS[machine]:
        if os.path.exists(header):
            text = Path(header).read_text()
            return {
                m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text)
            }
    pytest.skip(f"no kernel header with {machine}'s syscall numbers (linux-libc-dev)")


def run_filter(program: bytes, nr: int, arch: int, *args: int) -> int:
    """What the kernel returns for one call: the program run over its seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    code = [struct.unpack_from("<HBBI", program, at) for at in range(0, len(program), 8)]
    assert len(program) % 8 == 0 and 0 < len(code) <= BPF_MAXINSNS
    pc = acc = 0
    while True:
        op, jt, jf, k = code[pc]
        if op == RET_K:
            return k
        if op == LD_W_ABS:
            assert k % 4 == 0 and k + 4 <= len(data), f"load at {k}"
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif op in (JMP_JEQ_K, JMP_JGE_K, JMP_JSET_K):
            taken = {JMP_JEQ_K: acc == k, JMP_JGE_K: acc >= k, JMP_JSET_K: acc & k != 0}[op]
            pc += 1 + (jt if taken else jf)
        else:
            raise AssertionError(f"instruction {op:#x} at {pc}")
        assert pc < len(code), "a jump past the end"  # the kernel refuses such a program


@pytest.mark.parametrize("machine", sorted(AUDIT_ARCH))
def test_the_filter_denies_the_same_calls_on_every_machine(machine):
    nr = syscall_table(machine)
    program = jail.seccomp_filter(machine)
    arch = AUDIT_ARCH[machine]
    eperm, enosys = ERRNO | errno.EPERM, ERRNO | errno.ENOSYS

    for name in DENIED:
        assert run_filter(program, nr[name], arch) == eperm, name
    for name in ALLOWED:
        assert run_filter(program, nr[name], arch) == ALLOW, name
    assert run_filter(program, nr["clone"], arch, CLONE_NEWUSER | SIGCHLD) == eperm
    assert run_filter(program, nr["clone"], arch, SIGCHLD) == ALLOW  # fork
    assert run_filter(program, nr["unshare"], arch, CLONE_NEWUSER) == eperm
    assert run_filter(program, nr["unshare"], arch, CLONE_NEWNS) == ALLOW
    assert run_filter(program, nr["clone3"], arch) == enosys  # libc falls back to clone


@pytest.mark.parametrize("machine", sorted(AUDIT_ARCH))
def test_only_unix_sockets_are_allowed(machine):
    nr = syscall_table(machine)
    program = jail.seccomp_filter(machine)
    arch = AUDIT_ARCH[machine]
    refused = [AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_BLUETOOTH, AF_ALG, AF_VSOCK]
    # An allow-list: families no table names, up to the kernel's newest, stay closed.
    refused += [0, AF_XDP, 45, 46, 63, 255, 1 << 31]
    for call in ("socket", "socketpair"):
        assert run_filter(program, nr[call], arch, AF_UNIX, 1) == ALLOW
        # The kernel reads an int: high bits set beside AF_UNIX still mean AF_UNIX.
        assert run_filter(program, nr[call], arch, (7 << 32) | AF_UNIX) == ALLOW
        for family in refused:
            assert run_filter(program, nr[call], arch, family, 1) == ERRNO | errno.EPERM
        assert run_filter(program, nr[call], arch, (1 << 32) | AF_VSOCK) == ERRNO | errno.EPERM


@pytest.mark.parametrize("machine", sorted(AUDIT_ARCH))
def test_calls_of_another_abi_get_enosys(machine):
    nr = syscall_table(machine)
    program = jail.seccomp_filter(machine)
    others = {**FOREIGN_ARCHES, **{m: a for m, a in AUDIT_ARCH.items() if m != machine}}
    for name, arch in others.items():
        for number in (nr["getpid"], nr["keyctl"], nr["socket"]):
            assert run_filter(program, number, arch, AF_VSOCK) == ERRNO | errno.ENOSYS, name
    if machine == "x86_64":  # x32 shares x86_64's AUDIT_ARCH, with bit 30 set
        x32_getpid = 0x40000000 | nr["getpid"]
        assert run_filter(program, x32_getpid, AUDIT_ARCH[machine]) == ERRNO | errno.ENOSYS


# Loads a program into this kernel after no_new_privs; once loaded, every call of this
# x86_64 process is foreign to an aarch64 filter: even exit fails, and libc's fallback
# instruction ends the process with SIGSEGV. A program the kernel refuses: exit code 1.
LOAD = """import os, resource, sys
from collabrl.tools import jail
from collabrl.tools.sandbox import JAIL
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
jail.check(jail.libc.prctl(jail.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
jail.install_seccomp(sys.argv[1])
os._exit(0)
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="loads a foreign filter on x86_64")
def test_the_kernel_accepts_the_aarch64_program():
    loaded = subprocess.run([sys.executable, "-c", LOAD, "aarch64"], capture_output=True)
    assert loaded.returncode == -signal.SIGSEGV, loaded.stderr.decode()


SETARCH = shutil.which("setarch")


def _can_pose_as_i686() -> bool:
    """Whether this x86_64 machine lets a process call itself i686 (`uname -m`)."""
    if SETARCH is None or os.uname().machine != "x86_64":
        return False
    return subprocess.run([SETARCH, "i686", "true"], capture_output=True).returncode == 0


needs_setarch = pytest.mark.skipif(
    not _can_pose_as_i686(), reason="needs setarch to make this x86_64 machine call itself i686"
)


@needs_setarch
def test_the_jail_runs_no_code_on_a_machine_without_a_table():
    marker = "ran-without-a-filter"
    # The jail reads its config only after the machine check: an empty one will do.
    jailed = subprocess.run(
        [SETARCH, "i686", sys.executable, "-I", "-B", "-c", JAIL, "{}"],
        input=f"print({marker!r})",
        capture_output=True,
        text=True,
    )
    assert jailed.returncode == 1
    assert marker not in jailed.stdout
    assert "seccomp filter has no syscall table for i686" in jailed.stderr


REFUSE = """import sys
from collabrl.errors import UserError
from collabrl.tools.sandbox import Sandbox, SandboxLimits
try:
    Sandbox(SandboxLimits(isolation=sys.argv[1]), python=sys.argv[2])
except UserError as error:
    print(error)
else:
    print("ran")
"""


@needs_setarch
@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=[m for m, _ in MODE_PAIRS])
def test_every_mode_refuses_a_machine_without_a_table(isolation, python):
    refused = subprocess.run(
        [SETARCH, "i686", sys.executable, "-c", REFUSE, isolation, python],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.count("\n") == 1  # one line, the UserError's
    assert "seccomp filter has no syscall table for i686" in refused.stdout
