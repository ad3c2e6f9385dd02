"""Hostile code through libc's own wrappers (socket, mq_open), which need no syscall
numbers, so these run on every machine the jail's seccomp filter covers; and the
multiprocessing start methods that start a fresh interpreter inside the jail.

Every mode that works here is tried, as in test_hostile.py.
"""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from collabrl.tools.python import trim_traceback
from collabrl.tools.sandbox import Sandbox, SandboxLimits
from tests.tools.test_hostile import LIMITS, MODE_PAIRS

MODE_IDS = [mode for mode, _ in MODE_PAIRS]

libc = ctypes.CDLL(None, use_errno=True)

# Families by <sys/socket.h> number: the hypervisor's (vsock), the kernel's (netlink),
# raw frames (packet), crypto (alg), radios (bluetooth), and plain IP.
FAMILIES = {"AF_VSOCK": 40, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
FAMILIES |= {"AF_PACKET": 17, "AF_BLUETOOTH": 31, "AF_ALG": 38, "AF_XDP": 44}

SOCKETS = """import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
pair = (ctypes.c_int * 2)()
for name, family in {families}.items():
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):
        fd = libc.socket(family, kind, 0)
        paired = libc.socketpair(family, kind, 0, pair)
        print(name, kind, fd if fd < 0 else 'opened', paired if paired < 0 else 'opened',
              ctypes.get_errno() if min(fd, paired) < 0 else 0)
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).connect((2, 9999))  # the host's CID
except OSError as error:
    print('vsock connect', error.errno)
left, right = socket.socketpair()
left.sendall(b'unix works')
print(right.recv(16).decode())
abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
abstract.bind(b'\\0' + {abstract!r})
print('bound', abstract.getsockname())
"""


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_no_socket_family_but_unix_opens(isolation, python):
    abstract = f"collab-hostile-{os.getpid()}".encode()  # rlimits mode: the host's names
    code = SOCKETS.format(families=FAMILIES, abstract=abstract)
    result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(code)
    assert result.ok, result
    *refused, vsock, unix, bound = result.stdout.splitlines()
    kinds = (1, 2, 3)  # SOCK_STREAM, SOCK_DGRAM, SOCK_RAW
    assert refused == [f"{name} {kind} -1 -1 {errno.EPERM}" for name in FAMILIES for kind in kinds]
    assert vsock == f"vsock connect {errno.EPERM}"
    assert unix == "unix works"
    assert bound == f"bound {bytes(1) + abstract!r}"


QUEUE = f"/collab-hostile-{os.getpid()}".encode()
O_RDONLY, O_RDWR, O_CREAT = os.O_RDONLY, os.O_RDWR, os.O_CREAT
QUEUE_CODE = """import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
queue = libc.mq_open({name!r}, os.O_CREAT | os.O_RDWR, 0o600, None)
print(queue, ctypes.get_errno() if queue < 0 else 0)
print(resource.getrlimit(resource.RLIMIT_MSGQUEUE))
"""


@pytest.fixture
def no_queue_left():
    """Checks that the host holds no queue by the test's name afterwards, and removes it."""
    made = libc.mq_open(QUEUE, O_CREAT | O_RDWR, 0o600, None)
    if made < 0:
        pytest.skip(f"no POSIX message queues here: {os.strerror(ctypes.get_errno())}")
    os.close(made)
    libc.mq_unlink(QUEUE)
    yield
    left = libc.mq_open(QUEUE, O_RDONLY, 0, None)
    if left >= 0:
        os.close(left)
        libc.mq_unlink(QUEUE)
    assert left < 0 and ctypes.get_errno() == errno.ENOENT, "a run left a message queue"


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_no_message_queue_outlives_the_run(isolation, python, no_queue_left):
    # rlimits mode shares the host's IPC namespace, where a queue would stay after the
    # run, holding memory outside every limit and readable by the next run.
    code = QUEUE_CODE.format(name=QUEUE)
    result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(code)
    assert result.ok, result
    assert result.stdout.splitlines() == [f"-1 {errno.EPERM}", "(0, 0)"]


POOL = """import multiprocessing
def cube(x):
    return x ** 3
if __name__ == '__main__':
    with multiprocessing.get_context({method!r}).Pool(2) as pool:
        print(pool.map(cube, range(4)))
"""


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_pools_that_start_fresh_interpreters_work(method, isolation, python):
    # Their children rebuild __main__ from a file, chdir to the working dir by its
    # path, and (forkserver) talk over a unix socket.
    limits = SandboxLimits(**LIMITS | {"wall_seconds": 20}, isolation=isolation)
    result = Sandbox(limits, python=python).run(POOL.format(method=method))
    assert result.ok, result
    assert result.stdout == "[0, 1, 8, 27]\n"


FAILING_POOL = """import multiprocessing
def invert(x):
    return 1 / x
if __name__ == '__main__':
    with multiprocessing.get_context('spawn').Pool(2) as pool:
        print(pool.map(invert, range(3)))
"""


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_a_spawned_childs_traceback_quotes_the_code(isolation, python):
    limits = SandboxLimits(**LIMITS | {"wall_seconds": 20}, isolation=isolation)
    result = Sandbox(limits, python=python).run(FAILING_POOL)
    assert result.error_type == "ZeroDivisionError", result
    # The child's frame, in the jail's copy of the code, is the code's own, not a library's.
    assert "return 1 / x" in trim_traceback(result.stderr, max_lines=100), result.stderr
