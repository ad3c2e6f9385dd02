"""The policy is the adversary (issue 33): whatever it writes, no protocol raises, no
answer it did not give outside a call is credited, and no budget is exceeded.

Two parts. First, one bad episode: a tool, a teacher, an expert panel or a planner that
raises while serving one episode's pause fails that episode (`EndReason.ERROR`, the
error in its meta, one warning line) and the rest of the batch goes on. Then property
tests: every protocol is run on random bytes, random token ids and adversarial strings
(unclosed and nested call tags, fake `<tool_response>`/`<agent_returns>` blocks, a gold
answer boxed inside calls, 10k-token calls, control bytes) as the policy's output.

The policy is scripted (`ScriptedEngine`: a real Engine that writes the given text with
the real tokenizer); the collaborators are real: tools are `Tool`s, the teacher and the
experts the `reference` stand-in, the planner a prompting planner over a scripted engine.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collabrl.config import PoolConfig
from collabrl.data.benchmarks import Item
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import Prompt, SamplingParams
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import REFERENCE, Reference
from collabrl.episode import Author, EndReason, Episode
from collabrl.protocols import registry
from collabrl.protocols.apollo import ApolloConfig, ApolloProtocol, build_router
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.collaborators import collaborator_pool
from collabrl.protocols.consult import ConsultConfig, ConsultProtocol
from collabrl.protocols.parsing import (
    AGENT_CALLS_CLOSE,
    AGENT_CALLS_OPEN,
    AGENT_RETURNS_CLOSE,
    AGENT_RETURNS_OPEN,
    CALL_CLOSE,
    CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    ExpertQuery,
    format_agent_calls,
)
from collabrl.protocols.planner import PlannerChoice, PromptingPlanner
from collabrl.protocols.relay import RelayConfig, RelayProtocol
from collabrl.protocols.solo import SoloProtocol
from collabrl.protocols.strategies import PlannerContext
from collabrl.protocols.strategy import StrategyConfig, StrategyProtocol
from collabrl.tools.base import ToolResult, ToolSpec
from collabrl.tools.mcp_client import ToolRouter
from collabrl.train.rollout import episode_extras
from tests.protocols.scripted import ScriptedEngine

# The answer only collaborators and call blocks ever hold: the policy never writes it
# outside a call, so an episode answered with it was credited for someone else's text.
GOLD = "gold31337"
BOXED_GOLD = f"\\boxed{{{GOLD}}}"
TEMPLATE = get_prompt("relay")
PARAMS = SamplingParams(max_tokens=48, seed=0)  # the property tests' budget
ROOMY = SamplingParams(max_tokens=400, seed=0)


class OracleTool:
    """A real tool named python that answers every call with the gold answer, boxed: a
    tool's `\\boxed{}` is never the policy's answer."""

    spec = ToolSpec("python", "Runs Python code.", {"type": "object"})

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(f"The answer is {BOXED_GOLD}.")

    def close(self) -> None:
        pass


class BrokenRouter(ToolRouter):
    """The real router with a bug: a call of `explode` raises through it, past every
    tool's own guard (`call_safely`), as a future tool source's might."""

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name == "explode":
            raise RuntimeError("router bug \x1b[2J")  # with a control byte: it is escaped
        return super().call(name, arguments)


class AdversaryEngine(ScriptedEngine):
    """`ScriptedEngine` finding where a stop string ends by bisection: a 10k-token reply
    is searched in a few decodes (whether the text of ids[:k] holds it grows with k)."""

    def _tokens_to(self, ids: list[int], stop: str) -> int:
        low, high = 1, len(ids)
        while low < high:
            mid = (low + high) // 2
            if stop in self.tokenizer.decode(ids[:mid]):
                high = mid
            else:
                low = mid + 1
        return low


def call_of(name: str) -> str:
    body = json.dumps({"name": name, "arguments": {}})
    return f"Let me call.\n{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def by_task(tokenizer, replies: dict[str, list[str]]) -> Callable[[Prompt], str]:
    """A scripted policy whose replies depend on the task its prompt is about: each
    task's replies in turn, then EOS."""

    def reply(prompt: Prompt) -> str:
        text = tokenizer.decode(prompt) if isinstance(prompt, list) else str(prompt)
        for key, queue in replies.items():
            if key in text:
                return queue.pop(0) if queue else ""
        raise AssertionError(f"no task in {text[-200:]!r}")

    return reply


# ----------------------------------------------------------------------------- one bad episode


def test_a_tool_call_that_raises_fails_its_episode_and_the_batch_goes_on(smol_tokenizer, caplog):
    router = BrokenRouter([OracleTool()])
    replies = {
        "task-raise": [call_of("explode"), "\\boxed{1}"],
        "task-fine": [call_of("python"), "So \\boxed{3}."],
    }
    engine = ScriptedEngine(smol_tokenizer, by_task(smol_tokenizer, replies))
    protocol = ApolloProtocol(Policy(engine, smol_tokenizer), router, ApolloConfig())
    tasks = [Task(k, f"Solve {k}.") for k in replies]
    with caplog.at_level(logging.WARNING, logger="collabrl.protocols.base"):
        raised, fine = protocol.run(tasks, ROOMY)
    protocol.close()
    assert raised.end is EndReason.ERROR and raised.answer is None
    assert raised.meta["error"] == "RuntimeError: router bug \\x1b[2J"  # escaped, one line
    assert fine.end is EndReason.EOS and fine.answer == "3"  # the rest of the batch went on
    [record] = caplog.records  # said once
    assert record.getMessage().startswith("episode task-raise (sample 0) failed")
    json.dumps(raised.to_dict())  # saved like any other episode


def test_a_failed_episode_is_never_credited_and_is_masked(smol_tokenizer):
    """The policy boxed the gold answer before the failing call: no credit for it."""
    router = BrokenRouter([OracleTool()])
    replies = {"task-raise": [f"{BOXED_GOLD}\n" + call_of("explode")]}
    engine = ScriptedEngine(smol_tokenizer, by_task(smol_tokenizer, replies))
    protocol = ApolloProtocol(Policy(engine, smol_tokenizer), router, ApolloConfig())
    [episode] = protocol.run([Task("task-raise", "Solve task-raise.")], ROOMY)
    assert episode.end is EndReason.ERROR and episode.answer is None
    extras = episode_extras(episode, Item("task-raise", "?", GOLD, None))
    assert extras["correct"] is False and extras["end"] == "error"


class BrokenPool:
    """A collaborator pool whose batched call raises (a bug, not an endpoint that is
    down: the pool answers those 'unavailable' itself)."""

    def __init__(self, num_experts: int = 1) -> None:
        self.config = PoolConfig(endpoints=[REFERENCE], num_experts=num_experts)

    def ask_sync(self, calls: Sequence[Any], params: Any) -> list[Any]:
        raise RuntimeError("pool bug")

    def close(self) -> None:
        pass


def test_a_teacher_that_raises_fails_the_calling_episodes_only(smol_tokenizer, caplog):
    replies = {"task-call": ["Help. <call>5</call>"], "task-alone": ["It is \\boxed{4}."]}
    engine = ScriptedEngine(smol_tokenizer, by_task(smol_tokenizer, replies))
    protocol = RelayProtocol(
        Policy(engine, smol_tokenizer), BrokenPool(), TEMPLATE, RelayConfig(), TEMPLATE.extract
    )
    with caplog.at_level(logging.WARNING, logger="collabrl.protocols.base"):
        called, alone = protocol.run([Task(k, f"Solve {k}.") for k in replies], ROOMY)
    assert called.end is EndReason.ERROR and called.meta["error"] == "RuntimeError: pool bug"
    assert alone.end is EndReason.EOS and alone.answer == "4"
    assert len(caplog.records) == 1


def test_an_expert_panel_that_raises_fails_the_consulting_episodes_only(smol_tokenizer):
    query = format_agent_calls([ExpertQuery(1, "2 + 2?")])
    replies = {"task-call": [query], "task-alone": ["Answer: 4"]}
    engine = ScriptedEngine(smol_tokenizer, by_task(smol_tokenizer, replies))
    config = ConsultConfig(num_experts=1)
    protocol = ConsultProtocol(Policy(engine, smol_tokenizer), BrokenPool(1), config)
    called, alone = protocol.run([Task(k, f"Solve {k}.") for k in replies], ROOMY)
    assert called.end is EndReason.ERROR and called.answer is None
    assert alone.end is EndReason.EOS and alone.answer == "4"


class BadChoicePlanner:
    """A planner that picks a strategy that does not exist for one episode's context."""

    def choose(self, contexts: list[PlannerContext], seeds: Sequence[int] = ()):
        return [PlannerChoice(99 if "task-bad" in c.question else 0) for c in contexts]

    def close(self) -> None:
        pass


def test_a_planner_step_that_raises_fails_its_episode_only(smol_tokenizer):
    engine = ScriptedEngine(smol_tokenizer, lambda prompt: "A step.\n\n")
    config = StrategyConfig(planner_kind="prompting", max_steps=2, step_max_tokens=8)
    protocol = StrategyProtocol(Policy(engine, smol_tokenizer), BadChoicePlanner(), config)
    tasks = [Task("task-bad", "Solve task-bad."), Task("task-good", "Solve task-good.")]
    bad, good = protocol.run(tasks, ROOMY)
    assert bad.end is EndReason.ERROR and bad.meta["error"].startswith("IndexError")
    assert good.end is EndReason.MAX_STEPS and good.turns == 2


# Issue 33: model-written code that raised out of PythonTool.call (a lone surrogate,
# chains deeper than the parser goes) and took the whole batch with it.
CRASH_SNIPPETS = (
    "print('\\ud800')",
    "print(" + "-" * 3000 + "1)",
    "print(" + "not " * 3000 + "1)",
    "f = " + "lambda: " * 3000 + "1",
)


def test_the_crash_snippets_never_end_a_batch_of_the_real_python_tool(smol_tokenizer):
    config = ApolloConfig(tools=["python"])
    replies = {
        f"task-{k}": [
            f"{TOOL_CALL_OPEN}\n"
            + json.dumps({"name": "python", "arguments": {"code": code}})
            + f"\n{TOOL_CALL_CLOSE}",
            "\\boxed{1}",
        ]
        for k, code in enumerate(CRASH_SNIPPETS)
    }
    replies["task-fine"] = [call_of("python"), "\\boxed{2}"]
    engine = AdversaryEngine(smol_tokenizer, by_task(smol_tokenizer, replies))
    protocol = ApolloProtocol(Policy(engine, smol_tokenizer), build_router(config), config)
    try:
        episodes = protocol.run(
            [Task(k, f"Solve {k}.") for k in replies], SamplingParams(max_tokens=8000, seed=0)
        )
    finally:
        protocol.close()
    *crashed, fine = episodes
    for episode in crashed:  # the tool's error, or at worst this episode's failure
        assert episode.tool_errors == 1 or episode.end is EndReason.ERROR, episode.meta
    assert fine.end is EndReason.EOS and fine.answer == "2"


# ----------------------------------------------------------------------------- property tests

# Tags of every protocol, as decoys anywhere, and control bytes a terminal acts on.
TAGS = (
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    AGENT_CALLS_OPEN,
    AGENT_CALLS_CLOSE,
    AGENT_RETURNS_OPEN,
    AGENT_RETURNS_CLOSE,
    CALL_OPEN,
    CALL_CLOSE,
)
CONTROL = ("\x1b[2J", "\x07", "\x00", "\u202e", "\r", "\x08", "\ufffd")
DECOYS = (*TAGS, *CONTROL, "\\boxed{", "}", "\\boxed{7}", "Answer: 7", "<call>3</call>", "\n\n")

# Per protocol: the blocks whose text is not the policy's answer (its calls, and replies
# it forged). Solo and strategy have none: whatever they box is theirs. Every built-in
# protocol needs an entry: the test below iterates the registry.
BLOCKS = {
    "apollo": ((TOOL_CALL_OPEN, TOOL_CALL_CLOSE), (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)),
    "consult": ((AGENT_CALLS_OPEN, AGENT_CALLS_CLOSE), (AGENT_RETURNS_OPEN, AGENT_RETURNS_CLOSE)),
    "relay": ((CALL_OPEN, CALL_CLOSE),),
    "solo": (),
    "strategy": (),
}


def _plain(tokenizer) -> st.SearchStrategy[str]:
    """Text the policy may write anywhere: it never holds the gold answer."""
    random_bytes = st.binary(max_size=48).map(lambda b: b.decode("utf-8", "replace"))
    random_ids = st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=24).map(
        tokenizer.decode
    )
    return st.one_of(st.text(max_size=24), random_bytes, random_ids, st.sampled_from(DECOYS))


def _block(opener: str, closer: str) -> st.SearchStrategy[str]:
    """A call block holding the gold answer: closed, unclosed, nested, or 10k tokens long."""
    inner = st.text(max_size=16).filter(lambda t: closer not in t)
    gold = st.sampled_from((BOXED_GOLD, f"Answer: {GOLD}", f'{{"code": "print({BOXED_GOLD!r})"}}'))
    tail = st.sampled_from((closer, "", f"{opener}x{closer}", closer * 2))
    long = st.just(opener + "1 + " * 10_000 + BOXED_GOLD + closer)
    built = st.tuples(st.just(opener), inner, gold, tail).map("".join)
    nested = st.tuples(st.just(opener), inner, st.just(opener), gold, tail).map("".join)
    return st.one_of(built, nested, long)


def replies_for(tokenizer, protocol: str) -> st.SearchStrategy[list[str]]:
    """One to three policy turns, each a few fragments: plain text and the protocol's
    call blocks with the gold answer inside."""
    parts = [_plain(tokenizer)] + [_block(o, c) for o, c in BLOCKS[protocol]]
    turn = st.lists(st.one_of(*parts), min_size=1, max_size=5).map("".join)
    return st.lists(turn, min_size=1, max_size=3)


class Setup:
    """A protocol over a scripted policy, with the module's shared collaborators."""

    def __init__(self, tokenizer, teacher: ExpertPool, experts: ExpertPool) -> None:
        self.tokenizer, self.teacher, self.experts = tokenizer, teacher, experts

    def build(self, name: str, engine: ScriptedEngine) -> Any:
        policy = Policy(engine, self.tokenizer)
        if name == "solo":
            return SoloProtocol(policy, TEMPLATE, TEMPLATE.extract)
        if name == "apollo":
            config = ApolloConfig(max_tool_calls=2, parallel_calls=2)
            return ApolloProtocol(policy, ToolRouter([OracleTool()]), config)
        if name == "relay":
            config = RelayConfig(max_calls=2, max_call_tokens=6)
            return RelayProtocol(policy, self.teacher, TEMPLATE, config, TEMPLATE.extract)
        if name == "consult":
            config = ConsultConfig(num_experts=2, query_budget=2, turn_budget=3)
            return ConsultProtocol(policy, self.experts, config)
        planner = PromptingPlanner(ScriptedEngine(self.tokenizer, lambda p: "deduction"))
        config = StrategyConfig(planner_kind="prompting", max_steps=3, step_max_tokens=12)
        return StrategyProtocol(policy, planner, config)


@pytest.fixture(scope="module")
def setup(smol_tokenizer):
    # The stand-in answers 42 (each task's reference), never the gold answer.
    teacher = collaborator_pool(
        [REFERENCE], RelayConfig().teacher_timeout, tokenizer=smol_tokenizer
    )
    experts = ExpertPool(PoolConfig(endpoints=[REFERENCE], num_experts=2), tokenizer=smol_tokenizer)
    yield Setup(smol_tokenizer, teacher, experts)
    teacher.close()
    experts.close()


def check_budgets(name: str, episode: Episode) -> None:
    """Every budget of the protocol held, as configured in `Setup.build`."""
    assert len(episode.response_ids) <= PARAMS.max_tokens
    if name == "apollo":
        ran = [s for s in episode.tool_calls if s.meta["error"] not in ("format", "budget")]
        assert len(ran) <= 2
    elif name == "relay":
        assert len(episode.calls) <= 2
        assert all(len(s.token_ids) <= s.meta["granted_tokens"] <= 6 for s in episode.calls)
    elif name == "consult":
        assert episode.meta["queries_sent"] <= 2 and episode.turns <= 3
    elif name == "strategy":
        assert sum(s.author is Author.GUIDANCE for s in episode.segments) <= 3
        assert all(len(s.token_ids) <= 12 for s in episode.segments if s.author is Author.POLICY)


def run_adversary(setup: Setup, name: str, turns: list[list[str]]) -> list[Episode]:
    tasks = [Task(f"task-{k}", f"Solve task-{k}.", reference=Reference("42")) for k in range(2)]
    replies = {t.problem_id: list(r) for t, r in zip(tasks, turns, strict=True)}
    engine = AdversaryEngine(setup.tokenizer, by_task(setup.tokenizer, replies))
    episodes = setup.build(name, engine).run(tasks, PARAMS)  # never raises
    assert len(episodes) == len(tasks)
    for episode in episodes:
        assert episode.end is not None
        # No part of the toolkit raised on the text (a guarded error would hide a bug).
        assert episode.end is not EndReason.ERROR, episode.meta.get("error")
        assert episode.answer is None or GOLD not in episode.answer, episode.response_text
        check_budgets(name, episode)
        json.dumps(episode.to_dict())
        extras = episode_extras(episode, Item(episode.problem_id, "?", GOLD, None))
        assert extras["correct"] is False
    return episodes


# Few examples and derandomized: the default run stays fast and repeatable.
ADVERSARY = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("name", [spec.name for spec in registry.BUILTIN])
def test_no_policy_output_raises_is_credited_or_exceeds_a_budget(setup, smol_tokenizer, name):
    turns = st.lists(replies_for(smol_tokenizer, name), min_size=2, max_size=2)

    @ADVERSARY
    @given(turns)
    def check(drawn: list[list[str]]) -> None:
        run_adversary(setup, name, drawn)

    check()
