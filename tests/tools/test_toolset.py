"""The local tools by name: what apollo offers and `collab serve tools` serves."""

from __future__ import annotations

import pytest

from collabrl.errors import UserError
from collabrl.tools.python import PythonToolConfig
from collabrl.tools.retrieval import RetrievalConfig
from collabrl.tools.toolset import build_tools


def test_tools_come_in_the_order_named_and_python_consults_retrieve():
    python, retrieve = build_tools(["python", "retrieve"], PythonToolConfig(), RetrievalConfig())
    try:
        assert (python.spec.name, retrieve.spec.name) == ("python", "retrieve")
        assert python.retrieval is retrieve  # lent after library errors (§2.2)
    finally:
        python.close()
        retrieve.close()


def test_python_alone_consults_nothing():
    [python] = build_tools(["python"], PythonToolConfig(), RetrievalConfig())
    assert python.retrieval is None


def test_unknown_names_are_refused():
    with pytest.raises(UserError, match="unknown tool"):
        build_tools(["shell"], PythonToolConfig(), RetrievalConfig())
