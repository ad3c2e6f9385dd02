"""AlphaApollo's options (`protocol.apollo`): which tools, how often; config only, so
that `ProtocolConfig` and a trainer's config read them without loading the protocol
(`protocols/apollo.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.config import option
from collabrl.errors import UserError
from collabrl.tools.python import PythonToolConfig
from collabrl.tools.retrieval import RetrievalConfig
from collabrl.tools.toolset import LOCAL_TOOLS, check_tool_names


@dataclass
class ApolloConfig:
    """Which tools the policy may call, and how often (AlphaApollo)."""

    tools: list[str] = option(
        list(LOCAL_TOOLS),
        "Local tools offered: python (the sandboxed interpreter with error correction) "
        "and retrieve (documentation retrieval); [] offers only the MCP servers' tools.",
    )
    mcp_servers: list[str] = option(
        [],
        "MCP servers whose tools are offered too: 'stdio:COMMAND ARGS' or an HTTP URL "
        "(streamable HTTP, e.g. http://host:8765/mcp); see docs/mcp.md.",
    )
    python: PythonToolConfig = option(PythonToolConfig(), "The python tool.")
    retrieval: RetrievalConfig = option(RetrievalConfig(), "The retrieve tool.")
    max_tool_calls: int = option(
        8, "Tool calls per episode; later calls are answered 'tool call budget spent'."
    )
    max_response_chars: int = option(
        2000, "Characters of a tool's output shown to the policy; the rest is cut with a note."
    )
    parallel_calls: int = option(8, "Tool calls of one round that run at once.")
    few_shot: bool = option(
        False,
        "Append one worked python call to the system prompt (not in the paper): small "
        "models rarely call a tool from the schema alone.",
    )
    force_call: bool = option(
        False,
        "Open the policy's answer with <tool_call> (protocol text), so its first words are "
        "a call: for demos and small models that never call on their own; not in the paper.",
    )
    aid_tool: str = option(
        "python",
        "The tool of the sampling aids (not in the paper): few_shot's worked call, and for "
        "retrieve force_call also writes the call's name, so the forced call is a retrieve call.",
    )
    tools_off: bool = option(
        False,
        "Offer the tools in the prompt but ban <tool_call> from the policy's text (a call "
        "that slips through is answered, not run): the policy alone with the same prompt, "
        "for a like-for-like comparison (not in the paper).",
    )
    lenient_calls: bool = option(
        True,
        "Read a <tool_call> whose body is Python code, not the JSON asked for, as a call "
        "of the python tool (recorded as lenient).",
    )

    def check(self) -> None:
        check_tool_names(self.tools)
        self.python.check()
        self.retrieval.check()
        if self.aid_tool not in LOCAL_TOOLS:
            raise UserError(
                f"unknown apollo.aid_tool '{self.aid_tool}'", f"use {', '.join(LOCAL_TOOLS)}"
            )
        if self.force_call and self.tools_off:
            raise UserError(
                "apollo.force_call opens a call that apollo.tools_off bans", "set one of them"
            )
        # python's forced opening is the bare <tool_call> tag, which any tool may follow;
        # retrieve's names the tool, so that tool must be offered.
        if self.force_call and self.aid_tool != "python" and self.aid_tool not in self.tools:
            raise UserError(
                f"apollo.force_call opens a {self.aid_tool} call, but tools are {self.tools}",
                f"add {self.aid_tool} to apollo.tools, or set apollo.aid_tool to an offered tool",
            )
        if not self.tools and not self.mcp_servers:
            raise UserError(
                "the apollo protocol has no tools",
                "keep protocol.apollo.tools, or give protocol.apollo.mcp_servers",
            )
        for key in ("max_tool_calls", "max_response_chars", "parallel_calls"):
            if getattr(self, key) < 1:
                raise UserError(f"apollo.{key} must be >= 1, got {getattr(self, key)}")
        if self.mcp_servers:  # the MCP SDK is imported only when a server is named
            from collabrl.tools.mcp_client import parse_server

            for server in self.mcp_servers:
                parse_server(server)  # a malformed string fails before any model loads
