"""Executable verification in `collab evolve` (issue 36): a candidate's code re-runs in
the real sandbox, what it prints is checked against its answer, and the `verified`
rule selects over the verdicts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collabrl.data.benchmarks import Item
from collabrl.engines.base import SamplingParams
from collabrl.errors import UserError
from collabrl.evolve import EvolveConfig
from collabrl.evolve.execute import (
    answer_expression,
    check_candidate,
    equations,
    execute_checks,
)
from collabrl.evolve.metrics import round_summary
from collabrl.evolve.runner import Proposer, _propose
from collabrl.evolve.select import SELECTORS, select_by_verified, select_by_vote
from collabrl.evolve.state import (
    REFUTED,
    UNVERIFIED,
    VERIFIED,
    Candidate,
    CodeCheck,
)
from collabrl.evolve.verify import Reviewer, review
from collabrl.protocols.apollo import ApolloConfig, ApolloProtocol
from collabrl.protocols.base import Policy
from collabrl.protocols.parsing import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from collabrl.tools.mcp_client import ToolRouter
from collabrl.tools.python import PythonTool
from collabrl.tools.sandbox import Sandbox, SandboxLimits
from tests.evolve.test_run import _evolve
from tests.linear_time import assert_linear
from tests.protocols.scripted import ScriptedEngine
from tests.protocols.test_adversarial import by_task

# Short limits: a runaway snippet costs a second, not the default ten.
LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=3, memory_mb=1024)


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    return PythonTool(Sandbox(LIMITS))


def tool_segment(code: str) -> dict:
    """A python tool call as a saved episode holds it (apollo's `call_meta`)."""
    meta = {"tool": "python", "arguments": {"code": code}, "error": None}
    return {"author": "tool", "text": "(output)", "meta": meta}


def cand(answer: str | None, completion: str = "", calls: tuple[str, ...] = ()) -> Candidate:
    episode = {"segments": [tool_segment(code) for code in calls]}
    return Candidate(1, "p1", 0, 0, answer, completion, [], episode=episode)


def checked(answer: str | None, verdict: str, model: int = 0) -> Candidate:
    c = cand(answer)
    c.model, c.code_check = model, CodeCheck(verdict, "tool_call", "", "")
    return c


def test_a_tool_call_that_prints_the_answer_verifies_it(tool) -> None:
    check = check_candidate(cand("84", "It is \\boxed{84}.", ("print(12 * 7)",)), tool)
    assert check == CodeCheck(VERIFIED, "tool_call", "print(12 * 7)", "84")


def test_a_tool_call_that_disagrees_with_the_answer_refutes_it(tool) -> None:
    check = check_candidate(cand("85", "So \\boxed{85}.", ("print(12 * 7)",)), tool)
    assert (check.verdict, check.output) == (REFUTED, "84")


def test_code_that_crashes_or_runs_out_of_time_is_unverified(tool) -> None:
    crash = check_candidate(cand("3", "", ("print(1 / 0)",)), tool)
    assert crash.verdict == UNVERIFIED and "ZeroDivisionError" in crash.output
    # Every piece failed: the last one's failure is kept, not the first one's.
    both = check_candidate(cand("3", "", ("import nosuchmodule", "print(1 / 0)")), tool)
    assert both.verdict == UNVERIFIED and both.code == "print(1 / 0)"
    runaway = check_candidate(cand("3", "", ("while True:\n    pass",)), tool)
    assert runaway.verdict == UNVERIFIED and "limit" in runaway.output
    silent = check_candidate(cand("3", "", ("x = 3",)), tool)  # prints nothing
    assert silent.verdict == UNVERIFIED


def test_the_last_call_that_runs_and_prints_decides(tool) -> None:
    # The final computation crashed; the one before it printed the answer.
    calls = ("print(2 + 2)", "print(12 * 7)", "print(undefined_name)")
    assert check_candidate(cand("84", "", calls), tool).verdict == VERIFIED
    assert check_candidate(cand("4", "", calls), tool).verdict == REFUTED


def test_printed_sentence_is_read_by_its_last_number(tool) -> None:
    check = check_candidate(cand("1/2", "", ("print('the ratio is', 1/2)",)), tool)
    assert check.verdict == VERIFIED  # `0.5` and `1/2` are one value to is_equivalent
    third = check_candidate(cand("0.333", "", ("print(1 / 3)",)), tool)
    assert third.verdict == VERIFIED  # 0.3333333333333333, written to 3 decimals
    assert check_candidate(cand("0.334", "", ("print(1 / 3)",)), tool).verdict == REFUTED


def test_without_tool_calls_the_solutions_code_block_runs(tool) -> None:
    completion = "Compute it:\n```python\nprint(sum(range(10)))\n```\nSo \\boxed{45}."
    check = check_candidate(cand("45", completion), tool)
    assert (check.verdict, check.source) == (VERIFIED, "code_block")
    # Tool calls come first: the code block is not what ran.
    with_call = check_candidate(cand("45", completion, ("print(44)",)), tool)
    assert (with_call.verdict, with_call.source) == (REFUTED, "tool_call")


def test_without_code_the_arithmetic_the_answer_is_written_as_is_evaluated(tool) -> None:
    right = check_candidate(cand("84", "We get $12 \\times 7 = 84$, so \\boxed{84}."), tool)
    assert (right.verdict, right.source, right.code) == (VERIFIED, "expression", "print(12 * 7)")
    wrong = check_candidate(cand("85", "3 + 4 = 7 and 12 * 7 = \\boxed{85}"), tool)
    assert (wrong.verdict, wrong.code) == (REFUTED, "print(12 * 7)")
    prose = check_candidate(cand("84", "I think the answer is \\boxed{84}."), tool)
    assert (prose.verdict, prose.source) == (UNVERIFIED, None)
    assert check_candidate(cand(None, "12 * 7 = 84"), tool).verdict == UNVERIFIED


def test_answer_expression_takes_the_step_that_gives_the_answer() -> None:
    text = "First 3 + 4 = 7.\nThen 7 ^ 2 = 49.\nFinally 49 - 1 = 48."
    assert answer_expression(text, "49") == "7 ** 2"
    assert answer_expression(text, "48") == "49 - 1"
    assert answer_expression("The value 42 = 42.", "42") is None  # no operator: no check
    assert answer_expression("x = 5", "5") is None


# `[…]*\d[…]*=` retried every start and split of a run: cubic (2,000 digits took 40 s).
@pytest.mark.parametrize("run", ["1", "1 ", " ", "1+"], ids=["digits", "spaced", "blank", "sum"])
def test_answer_expression_is_linear_in_a_long_arithmetic_run(run: str) -> None:
    benign = ("We have 12 apples and 7 pears, so 19 fruits; " * 1500)[:65_536]
    hostile = (run * 65_536)[:65_536]
    assert_linear(lambda text: answer_expression(text, "84"), hostile, benign)


# The backtracking pattern `equations` replaced, as an oracle on short inputs.
_BACKTRACKING_EQUATION = re.compile(
    r"([-+*/^×÷().\d \t]*\d[-+*/^×÷().\d \t]*)=[ \t]*\$?(\\boxed\{[^{}]*\}|[-\d./]+)"
)
_EQUATION_PIECES = ["1", "2", "٣", " ", "\t", "=", "+", "*", "x", "$", "\\boxed{", "}", ".", "\n"]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_EQUATION_PIECES), max_size=16).map("".join))
def test_equations_are_what_the_backtracking_pattern_found(text: str) -> None:
    assert list(equations(text)) == _BACKTRACKING_EQUATION.findall(text)


def test_verified_selects_among_verified_then_not_refuted_then_all() -> None:
    # Two refuted 9s and one unverified 5 outvote nothing once a 7 is verified.
    pool = [checked("9", REFUTED), checked("9", REFUTED), checked("5", UNVERIFIED)]
    assert select_by_vote(pool) == "9"
    assert select_by_verified(pool) == "5"  # none verified: the refuted 9s drop out
    assert select_by_verified([*pool, checked("7", VERIFIED)]) == "7"
    assert select_by_verified(pool[:2]) == "9"  # every one refuted: the vote
    never_run = [cand("1"), cand("2"), cand("2")]  # `execute` off: the vote
    assert select_by_verified(never_run) == select_by_vote(never_run) == "2"
    assert select_by_verified([cand(None)]) is None
    assert "verified" in SELECTORS


def test_round_summary_reports_the_verified_rule_and_the_verdict_shares() -> None:
    pool = [checked("9", REFUTED), checked("9", REFUTED), checked("7", VERIFIED)]
    items = [Item("p1", "Problem.", "7", None)]
    summary = round_summary(1, pool, pool, items, 1)
    assert summary["selected"]["p1"] == {"score": "9", "vote": "9", "verified": "7"}
    assert summary["selected_verified_accuracy"] == 1.0
    assert summary["selected_vote_accuracy"] == 0.0
    assert (summary["verified"], summary["refuted"]) == (pytest.approx(1 / 3), pytest.approx(2 / 3))


def test_code_check_round_trips_and_old_records_load() -> None:
    c = checked("7", VERIFIED)
    assert Candidate.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    old = {k: v for k, v in c.to_dict().items() if k != "code_check"}  # before issue 36
    assert Candidate.from_dict(old).verdict == UNVERIFIED


def test_a_scripted_apollo_round_is_checked_before_its_reviews(smol_tokenizer, tool) -> None:
    def call(code: str) -> str:
        payload = json.dumps({"name": "python", "arguments": {"code": code}})
        return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"

    replies = {
        "Problem agree.": [call("print(12 * 7)"), "So \\boxed{84}."],
        "Problem differ.": [call("print(12 * 7)"), "So \\boxed{85}."],
        "Problem crash.": [call("print(1 / 0)"), "So \\boxed{3}."],
    }
    propose = by_task(smol_tokenizer, replies)

    def reply(prompt) -> str:  # a review is chat messages; the reviewer trusts every one
        chat = isinstance(prompt, list) and isinstance(prompt[0], dict)
        return "Verdict: correct" if chat else propose(prompt)

    engine = ScriptedEngine(smol_tokenizer, reply)
    protocol = ApolloProtocol(
        Policy(engine, smol_tokenizer), ToolRouter([tool]), ApolloConfig(tools=["python"])
    )
    proposers = [Proposer("scripted", protocol, Reviewer("scripted", engine))]
    items = [Item(name, f"Problem {name}.", "84", None) for name in ("agree", "differ", "crash")]
    config = EvolveConfig(models=["scripted"])
    config.sampling.n, config.sampling.max_tokens = 1, 200
    new = _propose(config, proposers, items, [], 1)
    execute_checks(new, tool)
    questions = {item.id: item.problem for item in items}
    review(new, questions, [p.reviewer for p in proposers], True, SamplingParams(16), 600)
    assert [c.verdict for c in new] == [VERIFIED, REFUTED, UNVERIFIED]
    assert [c.score for c in new] == [1.0, 1.0, 1.0]  # the reviews alone cannot tell
    review_prompts = [str(p) for p in engine.prompts if "Proposed final answer" in str(p)]
    assert any("Re-run of its tool call: refuted; it printed: 84" in p for p in review_prompts)
    summary = round_summary(1, new, new, items, 1)
    assert (summary["verified"], summary["refuted"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))


def test_collab_evolve_records_a_check_per_candidate_and_can_turn_it_off(
    cli, tiny_model_dir, tmp_path: Path
) -> None:
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"id": "q0", "problem": "Compute 12 * 7.", "answer": "84"}) + "\n")
    for execute in ("true", "false"):
        out = tmp_path / f"run-{execute}"
        printed = _evolve(
            cli, str(data), "--model", str(tiny_model_dir), "--rounds", "1", "--branches", "2",
            "--max-tokens", "8", "--select", "verified", "--out", str(out),
            "--set", "review_max_tokens=4", "--set", f"execute={execute}",
        )  # fmt: skip
        assert "selected (verified)" in printed and "final answer by verified" in printed
        (summary,) = json.loads((out / "state.json").read_text())["rounds"]
        assert {"selected_verified_accuracy", "verified", "refuted"} <= summary.keys()
        lines = (out / "round-1.jsonl").read_text().splitlines()
        checks = [json.loads(line)["code_check"] for line in lines]
        # A random tiny model writes no code and no answer: unverified, or never re-run.
        if execute == "true":
            assert [check["verdict"] for check in checks] == [UNVERIFIED, UNVERIFIED]
        else:
            assert checks == [None, None]


def test_bad_sandbox_limits_are_refused_before_any_model_loads() -> None:
    config = EvolveConfig(models=["smollm2-135m"], sandbox=SandboxLimits(cpu_seconds=0))
    with pytest.raises(UserError, match="sandbox cpu_seconds is 0"):
        config.check()
