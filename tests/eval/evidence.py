"""Load a script of scripts/evidence/ as a module, so that its tests call its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EVIDENCE = Path(__file__).resolve().parents[2] / "scripts" / "evidence"


def load_script(name: str) -> ModuleType:
    """scripts/evidence/NAME.py as the module NAME (registered first: a dataclass in it
    looks its module up in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, EVIDENCE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
