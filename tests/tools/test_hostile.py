"""Hostile code against the sandbox, in "auto" and in every other mode that works here.

Each snippet must come back as a failed `Execution` with a readable error, leave
pytest alive, leak no secret from our environment, change nothing outside, and
leave no process of a throwaway uid behind. Snippets that the rlimits mode is
documented not to stop (docs/tools.md) are skipped there, with the reason.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from collabrl.tools.sandbox import MODES, Sandbox, SandboxLimits, probe, resolve_isolation

SECRET = "sk-secret-sentinel"
REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"


def _modes() -> list[tuple[str, str]]:
    """(isolation, python) pairs: auto, then each other mode not already auto's pick.

    As root, the rlimits mode needs an interpreter the throwaway uid can read; when
    the venv's is not (e.g. under /root), the system python runs the snippets.
    """
    auto = resolve_isolation("auto")
    pairs = [("auto", sys.executable)]
    for mode in MODES:
        if mode == auto:
            continue
        for python in (sys.executable, SYSTEM_PYTHON):
            if os.path.exists(python) and probe(mode, python) is None:
                pairs.append((mode, python))
                break
    return pairs


MODE_PAIRS = _modes()

# What the rlimits mode does not guarantee (docs/tools.md), so those snippets do not apply.
RLIMITS_GAPS = {
    "write_tmp": "rlimits mode does not confine writes to world-writable places",
    "read_passwd": "rlimits mode leaves world-readable files readable",
    "fill_disk_many_files": "rlimits mode limits the size of each file, not their total",
    "dns_lookup": "libc may resolve names over AF_UNIX, through the host's nscd or resolved",
}

# A kill that reached nothing still has to end the run as a failure.
STILL_HERE = "raise SystemExit('the kill did not end this run')"

# Placeholders: {outside} a path outside the sandbox the test watches, {sentinel} a file
# that must survive, {tcp}/{udp} ports of servers this test listens with on 127.0.0.1.
SNIPPETS = {
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "spawn_loop": (
        "import subprocess, sys\nkids = []\nwhile True:\n"
        "    kids.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(99)']))"
    ),
    "cpu_loop": "while True:\n    pass",
    "sleep_forever": "import time\ntime.sleep(1000)",
    "allocate_10gb": "block = bytearray(10 * 2**30)",
    "huge_output": "while True:\n    print('x' * 1000)",
    "write_tmp": "open('/tmp/{name}', 'w').write('pwned')\nopen('{outside}', 'w').write('pwned')",
    "write_root": "open('/root/{name}', 'w').write('pwned')",
    "write_repo": "open('{repo}/{name}', 'w').write('pwned')",
    "delete_sentinel": "import os\nos.remove('{sentinel}')",
    "read_passwd": "print(open('/etc/passwd').read())",
    "read_shadow": "print(open('/etc/shadow').read())",
    "parent_environ": "import os\nprint(open(f'/proc/{{os.getppid()}}/environ').read())",
    "pid1_environ": "print(open('/proc/1/environ').read())",
    "own_environ": "import os\nprint(dict(os.environ))\nassert 'OPENAI_API_KEY' in os.environ",
    "tcp_connect": (
        "import socket\nsocket.create_connection(('127.0.0.1', {tcp}), timeout=2).sendall(b'hi')"
    ),
    "udp_send": (
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.settimeout(1)\n"
        "s.sendto(b'hi', ('127.0.0.1', {udp}))\nprint(s.recvfrom(16))"
    ),
    "dns_lookup": "import socket\nprint(socket.getaddrinfo('pypi.org', 443))",
    "os_system": (
        "import os\nstatus = os.system('echo pwned > {outside}')\nassert status == 0, status"
    ),
    "subprocess_shell": (
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo pwned > {outside}'], check=True)"
    ),
    "kill_parent": "import os\nos.kill(os.getppid(), 9)\n" + STILL_HERE,
    "kill_everything": "import os\nos.kill(-1, 9)\n" + STILL_HERE,
    "kill_own_group": "import os\nos.killpg(os.getpgid(0), 9)\n" + STILL_HERE,
    "too_many_files": "files = [open('/dev/null') for _ in range(100000)]",
    "fill_disk_one_file": (
        "with open('big', 'wb') as f:\n    while True:\n        f.write(b'0' * 2**20)"
    ),
    "fill_disk_many_files": (
        "for i in range(10**6):\n"
        "    with open(f'f{{i}}', 'wb') as f:\n        f.write(b'0' * 2**20)"
    ),
    "ctypes_segfault": "import ctypes\nctypes.string_at(0)",
    "ctypes_setuid": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.setuid(0) == 0, ctypes.get_errno()"
    ),
    "setuid_root": "import os\nos.setuid(0)",
    "mount_tmpfs": (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0, ctypes.get_errno()"
    ),
    "chdir_escape": (
        "import os\nfor _ in range(64):\n    os.chdir('..')\nopen('{outside}', 'w').write('pwned')"
    ),
    "symlink_out": "import os\nos.symlink('{sentinel}', 'link')\nopen('link', 'w').write('pwned')",
    "deep_recursion": (
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)"
    ),
    "thread_flood": (
        "import threading, time\nwhile True:\n"
        "    threading.Thread(target=time.sleep, args=(99,), daemon=True).start()"
    ),
    "escape_session": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(99)\n"
        "raise SystemExit(7)"
    ),
}

# The limit each snippet must be reported as (a fork bomb may hit any of several first).
EXPECTED_LIMITS = {
    "cpu_loop": {"cpu_time"},
    "sleep_forever": {"wall_time"},
    "allocate_10gb": {"memory"},
    "huge_output": {"output"},
    "too_many_files": {"open_files"},
    "fill_disk_one_file": {"disk"},
    "thread_flood": {"processes", "wall_time", "output"},
    "fork_bomb": {"processes", "wall_time", "output"},
}

LIMITS = dict(cpu_seconds=2, wall_seconds=4, memory_mb=1024, max_processes=16, disk_mb=8)


@pytest.fixture(autouse=True)
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


@pytest.fixture
def servers():
    """A TCP and a UDP socket on 127.0.0.1 that no sandboxed code may reach."""
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    for s in (tcp, udp):
        s.setblocking(False)
    yield tcp, udp
    tcp.close()
    udp.close()


def _throwaway_processes() -> list[str]:
    """Processes still running as a sandbox's throwaway uid (>= 1,000,000)."""
    left = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue  # gone meanwhile
        uid = int(text.split("Uid:")[1].split()[0])
        if uid >= 1_000_000 and "zombie" not in text:
            left.append(status.parent.name)
    return left


@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=[m for m, _ in MODE_PAIRS])
@pytest.mark.parametrize("name", SNIPPETS)
def test_hostile_snippet_fails_cleanly(name, isolation, python, servers, tmp_path):
    if isolation == "rlimits" and name in RLIMITS_GAPS:
        pytest.skip(RLIMITS_GAPS[name])
    tcp, udp = servers
    sentinel = tmp_path / "sentinel"
    sentinel.write_text("keep me")
    outside = tmp_path / "outside"
    unique = f"collab-hostile-{os.getpid()}-{name}"
    code = SNIPPETS[name].format(
        outside=outside,
        sentinel=sentinel,
        repo=REPO,
        name=unique,
        tcp=tcp.getsockname()[1],
        udp=udp.getsockname()[1],
    )
    result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(code)

    assert not result.ok, result
    assert result.error_type, result
    assert SECRET not in result.stdout + result.stderr
    assert sentinel.read_text() == "keep me"
    for path in (outside, Path("/tmp") / unique, Path("/root") / unique, REPO / unique):
        assert not path.exists(), f"{name} wrote {path}"
    with pytest.raises(BlockingIOError):
        tcp.accept()
    with pytest.raises(BlockingIOError):
        udp.recvfrom(16)
    assert _throwaway_processes() == []
    assert os.environ["OPENAI_API_KEY"] == SECRET  # pytest itself is untouched
    if name in EXPECTED_LIMITS:
        assert result.limit in EXPECTED_LIMITS[name], result
