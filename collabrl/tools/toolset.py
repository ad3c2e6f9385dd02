"""The local tools by name: what `apollo` offers the policy and `collab serve tools` serves."""

from __future__ import annotations

from collabrl.errors import UserError
from collabrl.tools.base import Tool
from collabrl.tools.python import PythonToolConfig, build_python_tool
from collabrl.tools.retrieval import RetrievalConfig, build_retrieval_tool

LOCAL_TOOLS = ("python", "retrieve")


def check_tool_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in LOCAL_TOOLS]
    if unknown:
        raise UserError(f"unknown tool(s) {', '.join(unknown)}", f"use {', '.join(LOCAL_TOOLS)}")


def build_tools(
    names: list[str], python: PythonToolConfig, retrieval: RetrievalConfig
) -> list[Tool]:
    """The named tools, in order; if one fails, those already built are closed.

    When both are offered, the python tool consults the retrieve tool after a library
    error (§2.2), so retrieve is built first and lent to it.
    """
    check_tool_names(names)
    built: dict[str, Tool] = {}
    try:
        if "retrieve" in names:
            built["retrieve"] = build_retrieval_tool(retrieval)
        if "python" in names:
            built["python"] = build_python_tool(python, built.get("retrieve"))
    except BaseException:
        for tool in built.values():
            tool.close()
        raise
    return [built[name] for name in names]
