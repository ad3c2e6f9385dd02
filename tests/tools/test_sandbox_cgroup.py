"""A run as a whole is bounded by a cgroup of its own, where one is writable here.

Kernel rlimits bind each process alone: children that each stay under `memory_mb`
could together take the machine, and the OOM killer then picks among everything on
it. Every mode that works here is tried, as in test_hostile.py; the tests that need a
writable cgroup skip where there is none (users' machines, not CI's).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collabrl.tools import cgroup
from collabrl.tools.sandbox import Sandbox, SandboxLimits
from tests.tools.test_hostile import LIMITS, MODE_PAIRS

MODE_IDS = [mode for mode, _ in MODE_PAIRS]
needs_cgroup = pytest.mark.skipif(
    cgroup.run_bound() == cgroup.PER_PROCESS_ONLY, reason="no writable cgroup here"
)

# Three children, each touching 300 MiB (under the 1 GiB per-process cap) and holding
# it until all three have: 900 MiB together, over a 512 MiB run.
CHILDREN_TOGETHER = """import os, time
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(300 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
print([os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in kids])
"""


def _leftover_groups() -> list[Path]:
    """Run cgroups this process made that are still there."""
    found = cgroup.hierarchy()
    if found is None:
        return []
    prefix = f"collab-run-{os.getpid()}-"
    return [d for p in found.parents.values() for d in p.iterdir() if d.name.startswith(prefix)]


@needs_cgroup
@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_children_over_the_run_memory_together_are_stopped(isolation, python):
    limits = SandboxLimits(**LIMITS, run_memory_mb=512, isolation=isolation)
    result = Sandbox(limits, python=python).run(CHILDREN_TOGETHER)
    assert result.run_bound == cgroup.run_bound()
    assert result.limit == "memory", (result.stdout, result.stderr[-500:])
    assert "-9" in result.stdout  # the kernel killed a child of the run, not the caller
    assert _leftover_groups() == []


@needs_cgroup
@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_the_run_cgroup_is_removed_with_what_escaped_the_process_group(isolation, python):
    # A grandchild in a session of its own, still running when the code ends.
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    result = Sandbox(SandboxLimits(**LIMITS, isolation=isolation), python=python).run(code)
    assert result.ok, result.stderr
    assert _leftover_groups() == []


def test_without_a_writable_cgroup_a_run_is_bounded_per_process(monkeypatch):
    monkeypatch.setattr(cgroup, "_FOUND", [None])  # as on a machine with no writable cgroup
    result = Sandbox(SandboxLimits(**LIMITS)).run("print(1)")
    assert (result.ok, result.stdout, result.run_bound) == (True, "1\n", "per-process only")


def _cgroup_dir(path: Path, subtree: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.procs").touch()
    (path / "cgroup.subtree_control").write_text(subtree + "\n")
    return path


def test_cgroup_v2_runs_go_under_a_delegated_parent(tmp_path):
    """A v2 cgroup holding processes cannot enable controllers for children, so runs go
    under our own cgroup only at the root, else under a delegated parent; never higher."""
    root = _cgroup_dir(tmp_path, "memory pids")
    service = _cgroup_dir(root / "service", "memory pids")
    _cgroup_dir(service / "main", "")
    assert cgroup._v2_parent(root, "/service/main") == service
    assert cgroup._v2_parent(root, "/") == root
    (service / "cgroup.subtree_control").write_text("memory\n")  # pids not delegated
    assert cgroup._v2_parent(root, "/service/main") is None


@needs_cgroup
@pytest.mark.parametrize("isolation,python", MODE_PAIRS, ids=MODE_IDS)
def test_tmpfs_files_count_against_the_run_memory(isolation, python):
    """A jail's tmpfs pages sit outside RLIMIT_AS; the run's cgroup is charged for them."""
    if Sandbox(SandboxLimits(isolation=isolation), python=python).isolation == "rlimits":
        pytest.skip("rlimits mode has no tmpfs of its own")
    limits = SandboxLimits(**{**LIMITS, "disk_mb": 256}, run_memory_mb=128, isolation=isolation)
    code = "with open('f', 'wb') as f:\n    for _ in range(200):\n        f.write(bytes(1 << 20))\n"
    result = Sandbox(limits, python=python).run(code)
    assert result.limit == "memory", (result.exit_code, result.stderr[-500:])
