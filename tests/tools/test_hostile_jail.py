"""Hostile code against what the jail shares with the kernel rather than the disk:
the caller's keyring, kernel interfaces no maths code needs, and what a run can pile
up outside its memory limit (System V segments, memfds, empty files).

Every mode that works here is tried, as in test_hostile.py. The syscall numbers are
x86_64's; test_jail.py reads the filter's aarch64 table, and test_hostile_libc.py
needs no numbers.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from collabrl.tools.sandbox import Sandbox, SandboxLimits
from tests.tools.test_hostile import LIMITS, MODE_PAIRS

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the seccomp filter and these numbers are x86_64's"
)
MODE_IDS = [mode for mode, _ in MODE_PAIRS]

SYS_ADD_KEY, SYS_KEYCTL = 248, 250
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_INVALIDATE, KEYCTL_SEARCH = 1, 21, 10
KEY_SPEC_SESSION_KEYRING = -3
CALLER_KEY, LEFT_KEY = b"collab-caller-secret", b"collab-left-behind"
KEY_SECRET = b"keyring-secret-sentinel"

libc = ctypes.CDLL(None, use_errno=True)


def _syscall(*args: int | bytes | None) -> int:
    """libc.syscall with every integer passed as a long, as the kernel reads them."""
    return libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))


def _search_session(description: bytes) -> int:
    return _syscall(SYS_KEYCTL, KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", description, 0)


@pytest.fixture
def caller_key() -> int:
    """A key in the session keyring of this test process, as a trainer's container gives.

    The test first joins a keyring of its own, so nothing lands in root's shared one.
    """
    if _syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        pytest.skip(f"no keyrings here: {os.strerror(ctypes.get_errno())}")
    serial = _syscall(
        SYS_ADD_KEY, b"user", CALLER_KEY, KEY_SECRET, len(KEY_SECRET), KEY_SPEC_SESSION_KEYRING
    )
    assert serial > 0, os.strerror(ctypes.get_errno())
    yield serial
    for key in (serial, _search_session(LEFT_KEY)):
        if key > 0:
            _syscall(SYS_KEYCTL, KEYCTL_INVALIDATE, key)


PRELUDE = """import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
def syscall(*args):
    result = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return result, ctypes.get_errno() if result < 0 else 0
"""

KEYRING_CODE = PRELUDE + (
    "buffer = ctypes.create_string_buffer(256)\n"
    "print('search', syscall(250, 10, -3, b'user', {caller!r}, 0))\n"  # KEYCTL_SEARCH
    "print('read', syscall(250, 11, {serial}, buffer, 256), buffer.value)\n"  # KEYCTL_READ
    "print('add', syscall(248, b'user', {left!r}, b'x', 1, -3))\n"  # add_key to @s
)


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_the_callers_keyring_is_out_of_reach(isolation, python, caller_key):
    code = KEYRING_CODE.format(caller=CALLER_KEY, serial=caller_key, left=LEFT_KEY)
    result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(code)

    assert result.ok, result
    assert KEY_SECRET.decode() not in result.stdout
    assert result.stdout.splitlines() == [
        f"search (-1, {errno.EPERM})",
        f"read (-1, {errno.EPERM}) b''",
        f"add (-1, {errno.EPERM})",
    ]
    assert _search_session(LEFT_KEY) < 0  # nothing left behind for the next run


# Kernel interfaces the filter closes, each with the errno the code must read.
DENIED = {
    "unshare_user_namespace": ("syscall(272, 0x10000000)", errno.EPERM),
    # clone(CLONE_NEWUSER | SIGCHLD) like fork: a child that got through leaves at once.
    "clone_user_namespace": (
        "result = syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"
        "if result[0] == 0:\n    os._exit(0)\nresult",
        errno.EPERM,
    ),
    "clone3": ("syscall(435, None, 0)", errno.ENOSYS),  # libc then falls back to clone
    "io_uring_setup": ("syscall(425, 8, ctypes.create_string_buffer(120))", errno.EPERM),
    "memfd_create": ("syscall(319, b'ram', 0)", errno.EPERM),
    "keyctl_user_keyring": ("syscall(250, 0, -4, 1)", errno.EPERM),  # GET_KEYRING_ID @u
    "sysv_shmget": ("syscall(29, 0, 1 << 20, 0o1600)", errno.EPERM),  # IPC_PRIVATE
    "sysv_msgget": ("syscall(68, 0, 0o1600)", errno.EPERM),
    "sysv_semget": ("syscall(64, 0, 1, 0o1600)", errno.EPERM),
    # UFFD_USER_MODE_ONLY: what an unprivileged process may ask for where
    # vm.unprivileged_userfaultfd is 0.
    "userfaultfd": ("syscall(323, 1)", errno.EPERM),
    # A software clock counting this process in user space only: open to anyone up to
    # perf_event_paranoid 2 (struct perf_event_attr: type 1, size, flags at 40).
    "perf_event_open": (
        "attr = ctypes.create_string_buffer(struct.pack('<IIQ', 1, 128, 0), 128)\n"
        "ctypes.memmove(ctypes.addressof(attr) + 40, struct.pack('<Q', 1 << 5 | 1 << 6), 8)\n"
        "syscall(298, attr, 0, -1, -1, 0)",
        errno.EPERM,
    ),
}


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
@pytest.mark.parametrize("name", DENIED)
def test_kernel_interfaces_no_maths_needs_are_denied(name, isolation, python):
    call, expected = DENIED[name]
    *setup, last = call.splitlines()
    code = PRELUDE + "\n".join(setup) + f"\nprint(*{last})"
    result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(code)
    assert result.ok, result
    assert result.stdout == f"-1 {expected}\n", result


SEGMENT_KEY = 0x5EC0_0000 + os.getpid() % 0x10000


def _host_segments(key: int) -> list[int]:
    """Ids of the host's System V shared memory segments with `key` (/proc/sysvipc)."""
    rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return [int(row.split()[1]) for row in rows if int(row.split()[0]) == key]


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_no_shared_memory_segment_outlives_the_run(isolation, python):
    # rlimits mode shares the host's IPC namespace: a segment made there would stay,
    # outside every memory limit, readable by the next run.
    code = PRELUDE + f"print(syscall(29, {SEGMENT_KEY}, 1 << 20, 0o1666))"  # IPC_CREAT
    try:
        result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(code)
        assert result.ok, result
        assert _host_segments(SEGMENT_KEY) == []
    finally:
        for segment in _host_segments(SEGMENT_KEY):
            libc.shmctl(segment, 0, None)  # IPC_RMID


@pytest.mark.skipif(os.geteuid() != 0, reason="the inode cap needs a root parent (remount)")
@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_each_tmpfs_caps_its_file_count(isolation, python):
    limits = SandboxLimits(**LIMITS, disk_inodes=256, isolation=isolation)
    sandbox = Sandbox(limits, python=python)
    if sandbox.isolation == "rlimits":
        pytest.skip("rlimits mode has no tmpfs of its own (docs/tools.md)")
    # Empty files cost no bytes of `disk_mb` but kernel memory each (660k in 5 s).
    code = (
        "for folder in ('.', '/tmp', '/dev/shm'):\n"
        "    made = 0\n"
        "    try:\n"
        "        while made < 5000:\n"
        "            open(f'{folder}/f{made}', 'w').close()\n"
        "            made += 1\n"
        "    except OSError as error:\n"
        "        print(folder, made <= 256, error.errno)\n"
    )
    result = sandbox.run(code)
    expected = [f"{folder} True {errno.ENOSPC}" for folder in (".", "/tmp", "/dev/shm")]
    assert result.stdout.splitlines() == expected, result


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_the_oom_killer_picks_the_run_before_the_caller(isolation, python):
    # Memory is bounded per process, not per run: when a run exhausts the machine, the
    # kernel must kill the run, not the trainer that started it.
    code = (
        "adj = '/proc/self/oom_score_adj'\n"
        "print(open(adj).read().strip())\n"
        "try:\n    open(adj, 'w').write('0')\nexcept OSError as error:\n    print(error.errno)\n"
        "print(open(adj).read().strip())\n"
    )
    result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(code)
    assert result.ok, result
    if os.geteuid() == 0:  # only a privileged write raises the floor the code may lower to
        assert result.stdout.splitlines() == ["1000", str(errno.EACCES), "1000"]
    else:
        assert result.stdout.splitlines()[0] == "1000"


# i386 getpid through `int 0x80` from machine code: the 32-bit ABI numbers its calls
# differently (288 is keyctl there), so the filter must refuse that ABI as a whole.
I386_GETPID = """import ctypes, mmap
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes.fromhex('b814000000cd80c3'))  # mov eax, 20; int 0x80; ret
print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())
"""


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_the_32_bit_abi_is_refused(isolation, python):
    host = subprocess.run([sys.executable, "-c", I386_GETPID], capture_output=True, text=True)
    if host.returncode != 0 or int(host.stdout) <= 0:
        pytest.skip("this kernel runs no 32-bit calls at all")
    result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(I386_GETPID)
    assert result.ok, result
    assert result.stdout == f"{-errno.ENOSYS}\n"
