"""`collabrl.plugin`, the one import surface of a protocol plugin: every name it lists is
there, each the object collabrl itself uses, and the example plugin imports nothing else
of collabrl (tests/cli/test_plugin_protocol.py runs that plugin through every command)."""

from __future__ import annotations

import ast
from pathlib import Path

import collabrl.plugin as plugin
from collabrl.episode import Episode
from collabrl.protocols.spec import ProtocolSpec

EXAMPLE = Path(__file__).parents[1] / "examples" / "collab-echo" / "collab_echo.py"


def test_every_listed_name_is_there_and_is_collabrls_own() -> None:
    for name in plugin.__all__:
        assert getattr(plugin, name) is not None, name
    # Re-exported, not wrapped: a plugin's spec and episodes are the built-in types.
    assert plugin.ProtocolSpec is ProtocolSpec and plugin.Episode is Episode
    from collabrl.engines.pool import ExpertPool

    assert plugin.ExpertPool is ExpertPool  # loaded when asked for


def test_the_example_plugin_imports_only_the_plugin_module() -> None:
    tree = ast.parse(EXAMPLE.read_text(encoding="utf-8"))
    modules = set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("collabrl"):
            modules.add(node.module)
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            modules.update(a.name for a in node.names if a.name.startswith("collabrl"))
    assert modules == {"collabrl.plugin"}
    assert names <= set(plugin.__all__)
