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
    """The named tools, built in order; if one fails, those already built are closed."""
    check_tool_names(names)
    builders = {
        "python": lambda: build_python_tool(python),
        "retrieve": lambda: build_retrieval_tool(retrieval),
    }
    tools: list[Tool] = []
    try:
        for name in names:
            tools.append(builders[name]())
    except BaseException:
        for tool in tools:
            tool.close()
        raise
    return tools
