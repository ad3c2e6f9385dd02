"""`apollo` (AlphaApollo): the policy reasons with tools, calling them mid-answer.

The policy gets the paper's system prompt (appendix A.1) and the tools' schemas, and
writes until `</tool_call>`. Each round, the calls of every episode that stopped there
run together (threads: a sandboxed Python run or a retrieval blocks), and each result
comes back as `<tool_response>…</tool_response>` on its own lines; the policy resumes,
until EOS, the token budget or its tool-call budget. The tools are the paper's Python
interpreter and documentation retrieval (`collabrl.tools`) plus the tools of any MCP
server in the config, all routed by name (the paper's manager).

In the Episode the tags are environment text and the result is a `tool` segment:
neither carries loss, so the same episodes train a policy with tool-integrated RL
(`collab train grpo --protocol apollo`), which the paper leaves for later.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from collabrl.data.prompts import PromptTemplate
from collabrl.engines.base import SamplingParams
from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.protocols.apollo_config import ApolloConfig
from collabrl.protocols.base import Policy, Task, append_if_room, environment, remaining
from collabrl.protocols.parsing import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    ToolCall,
    parse_tool_call,
    strip_blocks,
)
from collabrl.protocols.rounds import finish, guard, new_episodes, run_rounds, segment_end
from collabrl.protocols.spec import BuildContext, Collaborator, PolicyPrompt, ProtocolSpec
from collabrl.tools.base import ToolResult, ToolSpec
from collabrl.tools.toolset import build_tools

if TYPE_CHECKING:  # the router brings in the MCP client: not needed to check a config
    from collabrl.tools.mcp_client import ToolRouter

CALL_BUDGET_SPENT = "tool call budget spent"
TOOLS_OFF = "the tools are off"


def build_router(config: ApolloConfig) -> ToolRouter:
    """The paper's manager: the local tools and every MCP server's, routed by name."""
    from collabrl.tools.mcp_client import ToolRouter, parse_server

    tools = build_tools(config.tools, config.python, config.retrieval)
    try:
        return ToolRouter.connect(tools, [parse_server(s) for s in config.mcp_servers])
    except BaseException:
        for tool in tools:
            tool.close()
        raise


# ----------------------------------------------------------------------------- the prompt

# AlphaApollo appendix A.1, verbatim (the paper's "\\boxed{}" is a source-code escape).
SYSTEM_PROMPT = """\
There are some tools that you can use to help you solve the math problem.
Examine the available tools and determine which ones might relevant and useful for \
addressing the query. Make sure to consider the tool metadata for each tool.
Based on your thorough analysis, decide if your memory is complete and accurate enough to \
generate the final output, or if additional tool usage is necessary.
Please reason step by step, and put your final answer within \\boxed{}."""

# How to call: the paper hands the schemas to the chat template; SmolLM2's and many
# others' templates have no tool slot, so the same information is written out here.
_TOOLS_HEADER = (
    "To call a tool, write one JSON object with its name and arguments between "
    f"{TOOL_CALL_OPEN} and {TOOL_CALL_CLOSE}; its result comes back between "
    f"{TOOL_RESPONSE_OPEN} and {TOOL_RESPONSE_CLOSE}. The tools:\n<tools>\n"
)

# A worked call per tool, for `few_shot` (`apollo.aid_tool` picks one). The retrieve
# example's response is abridged from what the tool returns for that query.
FEW_SHOT = {
    "python": f"""
For example:
User: What is 12345 * 6789?
Assistant: Let me compute it.
{TOOL_CALL_OPEN}
{{"name": "python", "arguments": {{"code": "print(12345 * 6789)"}}}}
{TOOL_CALL_CLOSE}
{TOOL_RESPONSE_OPEN}
83810205
{TOOL_RESPONSE_CLOSE}
The product is \\boxed{{83810205}}.""",
    "retrieve": f"""
For example:
User: What is the default value of the `max_denominator` parameter of \
fractions.Fraction.limit_denominator?
Assistant: Let me look it up.
{TOOL_CALL_OPEN}
{{"name": "retrieve", "arguments": {{"repo_name": "fractions", "query": \
"fractions.Fraction.limit_denominator max_denominator default"}}}}
{TOOL_CALL_CLOSE}
{TOOL_RESPONSE_OPEN}
[1] pydoc:fractions:142-200
     |  limit_denominator(self, max_denominator=1000000)
     |      Closest Fraction to self with denominator at most max_denominator.
{TOOL_RESPONSE_CLOSE}
The signature says max_denominator=1000000, so the answer is \\boxed{{1000000}}.""",
}

# What `force_call` writes: the opening tag; for retrieve also the call up to its first
# argument, so that the forced call is a retrieve call even for a policy that has only
# ever seen python calls (it names the repo and writes the query).
FORCED_OPENING = {
    "python": f"{TOOL_CALL_OPEN}\n",
    "retrieve": f'{TOOL_CALL_OPEN}\n{{"name": "retrieve", "arguments": {{"repo_name": "',
}


def apollo_prompt(
    specs: list[ToolSpec], few_shot: bool, aid_tool: str = "python"
) -> PromptTemplate:
    """The system prompt of A.1 with the tools' schemas, one JSON object per line, and
    with `few_shot` the worked call of `aid_tool` when that tool is offered."""
    schemas = "\n".join(json.dumps(s.schema(), ensure_ascii=False) for s in specs)
    system = f"{SYSTEM_PROMPT}\n\n{_TOOLS_HEADER}{schemas}\n</tools>"
    if few_shot and any(s.name == aid_tool for s in specs):
        system += "\n" + FEW_SHOT[aid_tool]
    return PromptTemplate(
        name="apollo",
        system=system,
        user="{problem}",
        extract=("boxed",),
        source="AlphaApollo appendix A.1 (system prompt) with the A.2 tool schemas",
    )


# ----------------------------------------------------------------------------- responses


def shown_text(result: ToolResult, limit: int) -> str:
    """A result as the policy reads it: cut to `limit` characters, saying so."""
    text = result.text.strip()
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more characters cut)"


def response_segments(policy: Policy, shown: str, meta: dict[str, Any]) -> list[Segment]:
    """`<tool_response>` block as segments: the tags are environment, the body the tool's.

    It sits on its own lines (a newline after `</tool_call>` and after the block), so
    the policy resumes on a fresh line.
    """
    opening = f"\n{TOOL_RESPONSE_OPEN}\n"
    closing = f"\n{TOOL_RESPONSE_CLOSE}\n"
    return [
        environment(policy, opening),
        Segment(Author.TOOL, shown, policy.encode_foreign(shown), None, meta),
        environment(policy, closing),
    ]


def call_meta(call: ToolCall, result: ToolResult) -> dict[str, Any]:
    """A tool segment's meta: the call and its outcome (the tool's own details beside)."""
    return {
        **result.meta,
        "tool": call.name,
        "arguments": call.arguments,
        "lenient": call.lenient,
        "error": result.error,
    }


def format_errors(episode: Episode) -> int:
    """Calls that could not be read (not JSON, no name): what the metrics call format errors."""
    return sum(s.meta.get("error") == "format" for s in episode.tool_calls)


def call_text(episode: Episode) -> str:
    """The text that holds the call the last policy segment ended: the segment, after
    the opening tag the protocol wrote when it forced the call."""
    *before, last = episode.segments
    if before and before[-1].meta.get("forced_call"):
        return before[-1].text + last.text
    return last.text


# The blocks of the policy's own text that are not its answer: its calls (code, not an
# answer), and responses it wrote itself (an engine that misses the stop string).
NOT_ANSWER_BLOCKS = ((TOOL_CALL_OPEN, TOOL_CALL_CLOSE), (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE))


def policy_text(episode: Episode) -> str:
    """Where the answer is read: the policy's own text, its tool calls left out (a tool's
    printed `\\boxed{}`, or one inside a call's code, is not the policy's answer).

    A forced call's opening tag is protocol text, but it opens the block the policy's
    first segment closes, so it is kept to cut that block out too; a call cut off by the
    token budget is cut out to the end."""
    text = "\n".join(
        s.text for s in episode.segments if s.author is Author.POLICY or s.meta.get("forced_call")
    )
    return strip_blocks(text, *NOT_ANSWER_BLOCKS)


# ----------------------------------------------------------------------------- the protocol


class ApolloProtocol:
    name = "apollo"

    def __init__(
        self,
        policy: Policy,
        router: ToolRouter,
        config: ApolloConfig,
        extract_fallback: tuple[str, ...] = (),
    ) -> None:
        config.check()
        policy.require_tokenizer(self.name)
        self.policy = policy
        self.router = router
        self.config = config
        specs = router.specs()
        self.template = apollo_prompt(specs, config.few_shot, config.aid_tool)
        names = {s.name for s in specs}
        self.code_tool = "python" if config.lenient_calls and "python" in names else None
        self.extract = self.template.extractors(extract_fallback)
        self.executor = ThreadPoolExecutor(config.parallel_calls, thread_name_prefix="tool")

    def run(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        episodes = new_episodes(self.policy, self.template, tasks, self.name)
        if self.config.force_call:
            for episode in episodes:
                opening = FORCED_OPENING[self.config.aid_tool]
                episode.add(environment(self.policy, opening, forced_call=True))

        def after_policy(i: int, segment: Segment) -> ToolCall | None:
            return self._after_policy(episodes[i], segment, params)

        def serve(pauses: list[tuple[int, ToolCall]], round_no: int) -> list[int]:
            # A tool is meant never to raise, but one that does (or a result that cannot
            # be encoded) fails its own episode only (None: failed).
            def run_call(pause: tuple[int, ToolCall]) -> ToolResult | None:
                episode = episodes[pause[0]]
                return guard(episode, self._call, episode, pause[1])

            results = list(self.executor.map(run_call, pauses))
            return [
                i
                for (i, call), result in zip(pauses, results, strict=True)
                if result is not None
                and guard(episodes[i], self._respond, episodes[i], call, result, params)
            ]

        banned = (TOOL_CALL_OPEN,) if self.config.tools_off else ()
        stop = (TOOL_CALL_CLOSE,)
        run_rounds(self.policy, episodes, params, stop, after_policy, serve, banned)
        for episode in episodes:
            finish(episode, policy_text, self.extract)
            episode.meta["format_errors"] = format_errors(episode)
        return episodes

    def _after_policy(
        self, episode: Episode, segment: Segment, params: SamplingParams
    ) -> ToolCall | None:
        """The call the segment ends with, or None (end set) when the episode is over."""
        if segment.meta.get("stop_reason") != TOOL_CALL_CLOSE:
            episode.end = segment_end(segment)
            return None
        if remaining(episode, params) <= 0:
            episode.end = EndReason.LENGTH
            segment.meta["unanswered"] = str(episode.end)
            return None
        return parse_tool_call(call_text(episode), self.code_tool)

    def _call(self, episode: Episode, call: ToolCall) -> ToolResult:
        """Run one call; a malformed call or one past the budget is answered, not run."""
        if self.config.tools_off:  # the ban missed a spelling: answer, run nothing
            return ToolResult(f"Error: {TOOLS_OFF}; write the final answer.", error="off")
        if not call.ok:
            return ToolResult(f"Error: {call.error}.", error="format")
        if len(episode.tool_calls) >= self.config.max_tool_calls:
            return ToolResult(
                f"Error: {CALL_BUDGET_SPENT}; write the final answer.", error="budget"
            )
        assert call.name is not None
        return self.router.call(call.name, call.arguments)

    def _respond(
        self, episode: Episode, call: ToolCall, result: ToolResult, params: SamplingParams
    ) -> bool:
        """Append the response block; False when the episode ends instead."""
        shown = shown_text(result, self.config.max_response_chars)
        segments = response_segments(self.policy, shown, call_meta(call, result))
        return append_if_room(episode, segments, params)

    def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.policy.close()
        self.router.close()


# -- the spec --------------------------------------------------------------------------

# The tools: set through the `protocol.apollo` section, in-process or at MCP servers that
# the section checks (not model references, so neither listed as models nor probed).
TOOLS = Collaborator("tools", key="apollo", flag=None, served=False, author=Author.TOOL)


def build_apollo(ctx: BuildContext) -> ApolloProtocol:
    ctx.policy.require_tokenizer("apollo")  # before the tools start
    router = build_router(ctx.config.apollo)
    try:
        return ApolloProtocol(ctx.policy, router, ctx.config.apollo, ctx.extract_fallback)
    except BaseException:
        router.close()
        raise


SPEC = ProtocolSpec(
    name="apollo",
    help="AlphaApollo, the policy reasons with tools (python, retrieval, MCP)",
    build=build_apollo,
    section="apollo",
    prompt=PolicyPrompt.OWN,
    collaborators=(TOOLS,),
)
