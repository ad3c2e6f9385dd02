"""`collab doctor`: what this machine gives a run, each finding with what it would stop.

Every check looks, none changes anything: the versions of the libraries a run imports,
the GPUs torch sees, the sandbox the python tool runs code in (bwrap, and the seccomp
filter's table for this machine's architecture, as `tools/jail.py` picks it), the caches
models are read from and converted into, and the free disk where runs and caches are
written. A finding that would stop a run carries that as its `problem`.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from collabrl import runs
from collabrl.models import cache_home, hf_hub_cache

# Below this, a run's checkpoints (a 135M policy's are ~0.5 GiB each, with its optimizer
# state) or a converted model would not fit.
MIN_FREE_GIB = 2.0
# The libraries every run imports: one missing stops every run.
REQUIRED = ("torch", "transformers")


@dataclass(frozen=True)
class Finding:
    """One line of the report: what was checked, what was found, and, when it would stop a
    run, which runs and why (None: nothing stops)."""

    name: str
    found: str
    problem: str | None = None


def examine(where: Path) -> list[Finding]:
    """Every check, in the order the report shows them; `where` is the folder runs write
    into by default (the working directory)."""
    return [
        *library_findings(),
        gpu_finding(),
        *sandbox_findings(),
        *cache_findings(),
        disk_finding("disk (run folders)", where),
    ]


def library_findings() -> list[Finding]:
    """The versions of Python and of what runs import, from installed metadata."""
    versions = runs.installed_versions(("collabrl", "torch", "transformers", "trl", "vllm"))
    findings = [Finding("python", platform.python_version())]
    for name, found in versions.items():
        problem = None
        if found == "not installed" and name in REQUIRED:
            problem = f"every run: {name} is not installed (pip install collabrl)"
        elif found == "not installed" and name == "trl":
            problem = "collab train: trl is not installed (pip install collabrl)"
        elif found == "not installed" and name == "vllm":
            found = "not installed (optional: the vllm engine; pip install 'collabrl[vllm]')"
        findings.append(Finding(name, found, problem))
    return findings


def gpu_finding() -> Finding:
    """The GPUs torch sees, with its CUDA build; none is no problem: runs use the CPU."""
    try:
        import torch
    except ImportError:
        return Finding("GPUs", "unknown: torch does not import")
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only torch build"
    if not torch.cuda.is_available():
        return Finding("GPUs", f"none seen ({build}): runs use the CPU")
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(f"{index}: {props.name} {props.total_memory / 1024**3:.0f} GiB")
    return Finding("GPUs", f"{', '.join(gpus)} ({build})")


def sandbox_findings() -> list[Finding]:
    """The jail of the python tool (the apollo protocol, `collab serve tools`, the apollo
    warm-up): its seccomp filter needs a syscall table for this machine, and one of the
    isolation modes must run code here."""
    from collabrl.errors import UserError
    from collabrl.tools.jail import AUDIT_ARCH
    from collabrl.tools.sandbox import bwrap_binary, resolve_isolation

    machine = os.uname().machine  # what the jail reads
    stops = "the python tool (apollo, collab serve tools)"
    if machine in AUDIT_ARCH:
        seccomp = Finding("seccomp", f"{machine} (AUDIT_ARCH {AUDIT_ARCH[machine]:#x})")
    else:
        known = ", ".join(AUDIT_ARCH)
        seccomp = Finding(
            "seccomp", machine, f"{stops}: the filter has no syscall table for {machine} ({known})"
        )
    findings = [seccomp, Finding("bwrap", bwrap_binary() or "not found")]
    if seccomp.problem is None:  # without the filter no mode runs code: nothing to try
        try:
            findings.append(Finding("sandbox", f"isolation {resolve_isolation('auto')}"))
        except UserError as err:
            findings.append(Finding("sandbox", "no isolation works", f"{stops}: {err.problem}"))
    return findings


def cache_findings() -> list[Finding]:
    """The Hugging Face cache a hub name is read from (never downloaded into), and
    collabrl's own cache, where embedded and GGUF models are converted once."""
    hub = hf_hub_cache()
    models = sorted(p.name.removeprefix("models--") for p in hub.glob("models--*"))
    held = f"{len(models)} models" if hub.is_dir() else "absent: hub names cannot resolve"
    own = cache_home()
    writable = _writable(own)
    return [
        Finding("HF cache", f"{hub} ({held})"),
        Finding(
            "collabrl cache",
            f"{own} ({'writable' if writable else 'not writable'})",
            None
            if writable
            else f"embedded and .gguf models: {own} is not writable "
            "(set COLLABRL_HOME to a folder that is)",
        ),
        disk_finding("disk (collabrl cache)", own),
    ]


def disk_finding(name: str, folder: Path) -> Finding:
    """The free disk of the file system `folder` is (or would be) on."""
    free = shutil.disk_usage(_existing(folder)).free / 1024**3
    found = f"{free:.1f} GiB free at {folder}"
    if free < MIN_FREE_GIB:
        return Finding(name, found, f"runs writing there: under {MIN_FREE_GIB:g} GiB free")
    return Finding(name, found)


def _existing(folder: Path) -> Path:
    """`folder`, or its nearest parent that exists (a cache not made yet)."""
    folder = folder.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _writable(folder: Path) -> bool:
    """Whether this user could write `folder` (made when first needed, so its nearest
    existing parent decides when it is not there yet: a file there, and it never can)."""
    existing = _existing(folder)
    return existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def problems(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.problem is not None]
