"""The method registry: one `MethodSpec` per training method, looked up by name.

A method is one module that defines `SPEC` (`train/methods/spec.py`). The built-in ones
are named below as `module:SPEC`, exactly as a third-party package names its own in the
entry-point group `collabrl.methods` (`toy = "my_package.toy:SPEC"`): both load the same
way, once, on the first query. Loading by name is also what keeps the layering: the
config a method's hooks read (`train/grpo_config.py`) looks its spec up here, so this
module cannot import the method modules back. A test may `register(spec)` one for its
duration and `unregister` it after.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from collabrl.errors import unknown_name
from collabrl.train.methods.spec import MethodSpec

# Where an installed package registers a method: each entry point loads to a MethodSpec.
ENTRY_POINT_GROUP = "collabrl.methods"

BUILTIN = (
    "collabrl.train.methods.sft:SPEC",
    "collabrl.train.methods.grpo:SPEC",
    "collabrl.train.methods.relay:SPEC",
    "collabrl.train.methods.eapo:SPEC",
    "collabrl.train.methods.rsim:SPEC",
)

# The registered methods by name, in registration order (the built-in ones first).
_SPECS: dict[str, MethodSpec[Any]] = {}
# Plugins that could not be loaded, by entry-point name: why (the unknown-name error says).
_BROKEN: dict[str, str] = {}
_loaded = False
# A method name: a word of the command line (`collab train NAME`) and of a folder name.
_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def register(spec: MethodSpec[Any]) -> MethodSpec[Any]:
    """Add a method; its name must be a new lower-case word (`unregister` frees one)."""
    if not isinstance(spec, MethodSpec):
        raise TypeError(f"{spec!r} is a {type(spec).__name__}, not a MethodSpec")
    if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
        raise ValueError(f"the method name {spec.name!r} is not a lower-case word")
    if spec.name in _SPECS:
        raise ValueError(f"a method named {spec.name!r} is already registered")
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a registered method (a test's, or a plugin's being replaced)."""
    _SPECS.pop(name, None)


def _load() -> None:
    """Register the built-in methods, then every installed plugin's, once. A plugin that
    fails to load is skipped with one line on stderr: a broken third-party package must
    not stop the built-in methods (the unknown-name error names it)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for value in BUILTIN:
        register(EntryPoint(value.partition(":")[0].rpartition(".")[2], value, "").load())
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register(point.load())
        except (Exception, SystemExit) as error:  # a plugin's import: whatever it raises
            _BROKEN[point.name] = f"{type(error).__name__}: {error}".splitlines()[0]
            print(
                f"collabrl: skipped the method plugin '{point.name}' ({point.value}): "
                f"{_BROKEN[point.name]}",
                file=sys.stderr,
            )


def names() -> tuple[str, ...]:
    """The registered method names, the built-in ones first."""
    _load()
    return tuple(_SPECS)


def specs() -> tuple[MethodSpec[Any], ...]:
    """Every registered method's spec, the built-in ones first."""
    _load()
    return tuple(_SPECS.values())


def get(name: str) -> MethodSpec[Any]:
    """The spec of method `name`; a one-line UserError listing the names otherwise."""
    _load()
    spec = _SPECS.get(name)
    if spec is None:
        raise unknown_name("method", name, list(_SPECS), _BROKEN)
    return spec


def find(name: str) -> MethodSpec[Any] | None:
    """The spec of method `name`, or None (the config's check then names the known ones)."""
    _load()
    return _SPECS.get(name)


def grpo_names() -> tuple[str, ...]:
    """The methods `collab train NAME` runs through the GRPO trainer (all but sft)."""
    return tuple(spec.name for spec in specs() if spec.grpo)
