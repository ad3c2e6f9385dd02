"""One cgroup per sandbox run: bounds the memory and process count of the run as a whole.

Kernel rlimits bind each process alone, so 16 processes under a 4 GiB RLIMIT_AS may
hold 64 GiB together. A cgroup made for the run, with a memory limit and a pids
limit, binds them all, and a memory overrun then kills inside the run, never the
caller. Made as a child of the caller's own cgroup (or, in cgroup v2, of its
parent, where the caller sits in a leaf of a delegated subtree), in whichever
hierarchy is writable here:

- cgroup v2: `memory.max`, `memory.swap.max`, `pids.max`; needs a writable cgroup
  whose `cgroup.subtree_control` lists `memory` and `pids`.
- cgroup v1: `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap
  is accounted) in the memory hierarchy, `pids.max` in the pids hierarchy.

Where neither is writable, `RunGroup.create` returns None and a run is bounded per
process only (docs/tools.md says what that leaves open).
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PER_PROCESS_ONLY = "per-process only"  # what bounds a run where no cgroup is writable
# Exit code of the wrapper when the first process could not join the run's cgroup:
# the code is then never started (it would run unbounded).
JOIN_FAILED = 125


@dataclass(frozen=True)
class Hierarchy:
    """Where this process's cgroups are, as seen from here."""

    version: str  # "v1" or "v2"
    parents: dict[str, Path]  # controller ("memory", "pids"; v2: "") -> parent directory


def _mounts() -> dict[str, Path]:
    """Mount point of each v1 controller ("memory", "pids") and of v2 (""), at the root
    of its hierarchy as this process sees it (its cgroup namespace)."""
    found: dict[str, Path] = {}
    # Read by hand: psutil.disk_partitions lists mounts without mountinfo's root field
    # (fields[3]), which tells a hierarchy's root from a bind of a sub-cgroup.
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        fstype, options = fields[dash + 1], fields[dash + 3].split(",")
        if fields[3] != "/":
            continue  # a bind of a sub-cgroup (a container's view): paths would not line up
        if fstype == "cgroup2":
            found.setdefault("", Path(fields[4]))
        elif fstype == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options:
                    found.setdefault(controller, Path(fields[4]))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per controller ("memory", "pids"; v2: "")."""
    paths: dict[str, str] = {}
    # Read by hand: psutil has no reading of a process's cgroups.
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK) and os.access(directory / "cgroup.procs", os.W_OK)


def _v2_parent(mount: Path, own: str) -> Path | None:
    """A writable cgroup with memory and pids delegated to its children: our own (only
    possible at the root: the kernel lets no other cgroup hold processes and enable
    controllers for children), else our parent (we sit in a leaf of a delegated one)."""
    own_dir = mount / own.lstrip("/")
    for candidate in (own_dir, own_dir.parent):
        if not candidate.is_relative_to(mount):
            continue
        try:
            enabled = (candidate / "cgroup.subtree_control").read_text().split()
        except OSError:
            continue
        if {"memory", "pids"} <= set(enabled) and _writable(candidate):
            return candidate
    return None


def find_hierarchy() -> Hierarchy | None:
    """Where run cgroups can be made and joined here, or None (and None off Linux)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError):
        return None
    found = None
    if "" in mounts and "" in own:
        parent = _v2_parent(mounts[""], own[""])
        if parent is not None:
            found = Hierarchy("v2", {"": parent})
    if found is None:
        parents = {}
        for controller in ("memory", "pids"):
            if controller not in mounts or controller not in own:
                return None
            directory = mounts[controller] / own[controller].lstrip("/")
            if not (directory / "cgroup.procs").exists() or not _writable(directory):
                return None
            parents[controller] = directory
        found = Hierarchy("v1", parents)
    return found if _joinable(found) else None


def _joinable(found: Hierarchy) -> bool:
    """Whether a process can make, limit and join a run cgroup here: tried once, so
    that a run whose wrapper then fails to join is a rare, fail-closed event."""
    group = RunGroup.make(found, 64 << 20, 8)
    if group is None:
        return False
    try:
        return subprocess.run(group.wrap(["true"]), capture_output=True).returncode == 0
    finally:
        group.remove()


_FOUND: list[Hierarchy | None] = []
_FOUND_LOCK = threading.Lock()


def hierarchy() -> Hierarchy | None:
    """`find_hierarchy`, looked up once per process."""
    with _FOUND_LOCK:
        if not _FOUND:
            _FOUND.append(find_hierarchy())
        return _FOUND[0]


def run_bound() -> str:
    """What bounds a run as a whole here: "cgroup v1", "cgroup v2" or per process only."""
    found = hierarchy()
    return f"cgroup {found.version}" if found else PER_PROCESS_ONLY


@dataclass
class RunGroup:
    """The cgroup(s) of one run: one directory in v2, one per controller in v1."""

    version: str
    dirs: dict[str, Path]  # controller -> this run's directory

    @classmethod
    def create(cls, memory_bytes: int, max_pids: int) -> RunGroup | None:
        """Make the run's cgroup with its limits set, or None where none can be made."""
        found = hierarchy()
        return cls.make(found, memory_bytes, max_pids) if found else None

    @classmethod
    def make(cls, found: Hierarchy, memory_bytes: int, max_pids: int) -> RunGroup | None:
        """Make a cgroup in `found` with these limits, or None if the kernel refuses."""
        name = f"collab-run-{os.getpid()}-{secrets.token_hex(6)}"
        group = cls(found.version, {c: parent / name for c, parent in found.parents.items()})
        try:
            for directory in group.dirs.values():
                directory.mkdir()
            group._limit(memory_bytes, max_pids)
        except OSError:
            group.remove()
            return None
        return group

    def _limit(self, memory_bytes: int, max_pids: int) -> None:
        """Write the limits; a file marked optional is absent where its feature is off."""
        if self.version == "v2":
            memory = pids = self.dirs[""]
            # (file, value, optional); swap would extend the memory cap
            settings = [(memory / "memory.max", memory_bytes, False)]
            settings.append((memory / "memory.swap.max", 0, True))
        else:
            memory, pids = self.dirs["memory"], self.dirs["pids"]
            # memsw (memory + swap) must stay >= memory, so it is set after it
            settings = [(memory / "memory.limit_in_bytes", memory_bytes, False)]
            settings.append((memory / "memory.memsw.limit_in_bytes", memory_bytes, True))
        settings.append((pids / "pids.max", max_pids, False))
        for path, value, optional in settings:
            if not (optional and not path.exists()):
                path.write_text(str(value))

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started by a shell that first moves itself into the run's cgroup(s).

        The process joins before it execs, so everything it starts is inside: bwrap
        forks its jail at once, so moving its pid from out here would race with that.
        A shell rather than `preexec_fn`, which is unsafe in a threaded caller (runs
        share a `Sandbox` across threads). If joining fails, nothing is started.
        """
        joins = " && ".join(
            f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.dirs.values()
        )
        script = (
            f'{joins} && exec "$@"; echo "could not join the run\'s cgroup" >&2; exit {JOIN_FAILED}'
        )
        return ["/bin/sh", "-c", script, "collab-run", *argv]

    def memory_hit(self) -> bool:
        """Whether the kernel killed a process of the run for the run's memory limit."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        directory = self.dirs["" if self.version == "v2" else "memory"]
        try:
            text = (directory / name).read_text()
        except OSError:
            return False
        counts = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(counts.get("oom_kill", 0)) > 0

    def remove(self, timeout: float = 5.0) -> None:
        """Kill whatever of the run is left, then remove its cgroup(s) (bounded)."""
        deadline = time.monotonic() + timeout
        for directory in self.dirs.values():
            while directory.exists():
                self._kill_all(directory)
                try:
                    directory.rmdir()
                except OSError:  # EBUSY: a killed process is still exiting
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.005)

    @staticmethod
    def _kill_all(directory: Path) -> None:
        try:
            pids = (directory / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:  # gone meanwhile
                pass
