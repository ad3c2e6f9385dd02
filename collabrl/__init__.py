"""collabrl: multi-model collaborative reasoning — training and evaluation.

`collabrl.evaluate(...)` and `collabrl.train(...)` are the Python API (collabrl/api.py,
docs/api.md); a protocol plugin imports `collabrl.plugin`.
"""

# Nothing is imported on load, not even `typing`: the package's root runs before
# `collab`'s Ctrl-C guard (cli), so each import here would widen the moment in which a
# Ctrl-C prints a traceback through our code. Type checkers read `TYPE_CHECKING` as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The names of the Python API, loaded on first use.
API = ("evaluate", "train")
__all__ = ["__version__", *API]


def __getattr__(name: str) -> "Any":
    # Everything here is looked up when asked for, not on import: `import collabrl` stays
    # cheap (no torch, no transformers), and `collab` guards everything slower (cli). The
    # API is reached by name: it sits on every layer below it, so the package's root,
    # which they all import, must not import it back.
    from importlib import import_module

    if name == "train":
        # The training package, callable as the API's `train` (collabrl/train/__init__.py):
        # once imported, Python binds it to this name whatever is returned here.
        return import_module("collabrl.train")
    if name in API:
        return getattr(import_module("collabrl.api"), name)
    if name != "__version__":
        raise AttributeError(f"module 'collabrl' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("collabrl")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+source"


def __dir__() -> list[str]:
    return sorted([*globals(), *API, "__version__"])
