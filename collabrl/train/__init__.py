"""Training: the only package that imports TRL.

Trainers adapt TRL (GRPO with a rollout function built from a protocol, SFT warm-up,
the rSIM two-model trainer) and learn from Episodes; they never parse tags or drive
engines themselves. `episodes` says which rollouts a trainer may learn from.
"""

import sys
from importlib import import_module
from types import ModuleType
from typing import Any


class _CallablePackage(ModuleType):
    """This package, callable: `collabrl.train(...)` is the Python API's `train`
    (collabrl/api.py, docs/api.md). The function and this package share the name
    `collabrl.train`, and Python binds an imported subpackage to that name on its parent,
    so the package itself must answer the call."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # By name: the API sits above training (it imports it), not below.
        return import_module("collabrl.api").train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
