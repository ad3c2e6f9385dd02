"""Helpers shared by the CLI commands."""

from __future__ import annotations

from typing import Any


def without_none(tree: dict[str, Any]) -> dict[str, Any]:
    """Drop options the user did not give (None), so they don't override config layers."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            value = without_none(value)
            if value:
                out[key] = value
        elif value is not None:
            out[key] = value
    return out
