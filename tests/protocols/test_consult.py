"""The `consult` protocol (EAPO): turn handling, the returns block, budgets, ρ, modes.

Protocol logic runs with a scripted policy (a real Engine that "writes" given texts with
the real tokenizer: a random tiny model almost never emits `<agent_calls>`) against a
real local expert pool over the tiny model; the token-id bookkeeping is also checked
with the tiny model itself under a recording spy, and one end-to-end test runs
SmolLM2-135M as the policy and as an expert behind a real `collab serve` process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collabrl.config import EngineConfig, PoolConfig
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import REFERENCE, Reference
from collabrl.episode import Author, Episode, Segment
from collabrl.errors import UserError
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.consult import (
    QUERY_BUDGET_SPENT,
    ConsultProtocol,
    ConsultTurn,
    accepts,
    consult_turn,
    expert_messages,
    policy_text,
    training_prompt,
    truncated_share,
)
from collabrl.protocols.consult_config import (
    ANSWER_TOKENS,
    CALL_TOKENS,
    ConsultConfig,
    check_turn_fits,
    turn_tokens,
)
from collabrl.protocols.parsing import (
    AGENT_CALLS_CLOSE,
    AGENT_CALLS_OPEN,
    AGENT_RETURNS_CLOSE,
    AGENT_RETURNS_OPEN,
    ExpertQuery,
    agent_returns_pieces,
)
from tests.conftest import EMBEDDED
from tests.protocols.scripted import RecordingEngine, ScriptedEngine
from tests.servers import ServerProcess

K = 3
FAST = ConsultConfig(expert_max_tokens=6)
PARAMS = SamplingParams(max_tokens=400, seed=0)


def returns_block(results: list[tuple[int, str | None]]) -> str:
    """The `<agent_returns>` block answering a call, as one string."""
    return "".join(agent_returns_pieces(results))


def calls(*items: tuple[int, str]) -> str:
    """A well-formed call block, as the paper's example writes it."""
    body = [{"expert_id": i, "input_parameters": {"query": q}} for i, q in items]
    return f"{AGENT_CALLS_OPEN}\n{json.dumps(body)}\n{AGENT_CALLS_CLOSE}"


@pytest.fixture(scope="module")
def pool(tiny_model_dir: Path):
    with ExpertPool(PoolConfig(endpoints=[str(tiny_model_dir)], num_experts=K)) as p:
        yield p


def scripted(tokenizer, replies: list[str]) -> tuple[Policy, ScriptedEngine]:
    engine = ScriptedEngine(tokenizer, list(replies))
    return Policy(engine, tokenizer), engine


def run_one(
    tokenizer, pool, replies: list[str], config: ConsultConfig = FAST, params=PARAMS
) -> tuple[Episode, ScriptedEngine]:
    policy, engine = scripted(tokenizer, replies)
    [episode] = ConsultProtocol(policy, pool, config).run([Task("p", "What is 6 * 7?")], params)
    return episode, engine


def authors(episode: Episode) -> str:
    letter = {Author.POLICY: "P", Author.ENVIRONMENT: "E", Author.EXPERT: "X"}
    return "".join(letter[s.author] for s in episode.segments)


def contexts_at_policy_turns(episode: Episode) -> list[list[int]]:
    """The ids the policy must have been given at each turn: prompt + every earlier segment."""
    out, ids = [], list(episode.prompt_ids)
    for segment in episode.segments:
        if segment.author is Author.POLICY:
            out.append(list(ids))
        ids += segment.token_ids
    return out


def returns_blocks(episode: Episode) -> list[str]:
    """The text of every returns block (its segments joined), in order."""
    blocks, current = [], None
    for segment in episode.segments:
        if segment.author is Author.POLICY:
            if current is not None:
                blocks.append(current)
            current = None
        else:
            current = (current or "") + segment.text
    if current is not None:
        blocks.append(current)
    return blocks


# ----------------------------------------------------------------------------- the prompt


def test_training_prompt_renders_k_and_budget():
    system = training_prompt(3, 10).system
    assert "consult with a panel of three experts. Each question you can ask experts 10 times" in (
        system
    )
    assert "Can be 1, 2, or 3." in system and "(ID 1, 2, 3)" in system
    assert "Answer: The capital of NomanLand is NomanCity and its main export is widgets." in (
        system
    )
    assert training_prompt(3, 10).extract == ("answer_line", "boxed")
    other = training_prompt(5, 4).system
    assert "panel of five experts" in other and "4 times totally" in other
    assert "Can be 1, 2, 3, 4, or 5." in other and "(ID 1, 2, 3, 4, 5)" in other
    assert "Can be 1 or 2." in training_prompt(2, 10).system
    assert "panel of 12 experts" in training_prompt(12, 10).system
    # Only the K and budget places change; the rest is the same text.
    back = (
        other.replace("five", "three")
        .replace("4 times", "10 times")
        .replace("1, 2, 3, 4, or 5", "1, 2, or 3")
        .replace("ID 1, 2, 3, 4, 5", "ID 1, 2, 3")
    )
    assert back == system


def test_expert_prompt_is_the_eval_system_prompt_and_the_query():
    messages = expert_messages("capital of NomanLand")
    assert messages[0] == {"role": "system", "content": get_prompt("eapo-eval").system}
    assert messages[1] == {"role": "user", "content": "capital of NomanLand"}


# ----------------------------------------------------------------------------- one turn


def test_turn_with_a_valid_call():
    text = "<think>two parts</think>\n" + calls((1, "a"), (2, "b"))
    turn = consult_turn(text, AGENT_CALLS_CLOSE, K, queries_left=10)
    assert turn == ConsultTurn(True, (ExpertQuery(1, "a"), ExpertQuery(2, "b")))


def test_a_closing_tag_merged_with_the_next_character_still_calls():
    # SmolLM2 writes `</agent_calls>.` with the token `>.`: the stop ends inside it.
    text = calls((1, "a")) + "."
    turn = consult_turn(text, AGENT_CALLS_CLOSE, K, queries_left=10)
    assert turn == ConsultTurn(True, (ExpertQuery(1, "a"),))


def test_turn_without_a_call_sends_nothing():
    assert consult_turn("Answer: 4", None, K, 10) == ConsultTurn(False)


def test_dangling_call_at_eos_is_an_error_but_sends_nothing():
    turn = consult_turn(AGENT_CALLS_OPEN + '[{"expert_id": 1', None, K, 10)
    assert not turn.called and turn.queries == () and turn.errors == ("unclosed <agent_calls>",)


def test_close_without_open_is_an_error():
    turn = consult_turn("just text " + AGENT_CALLS_CLOSE, AGENT_CALLS_CLOSE, K, 10)
    assert turn.called and turn.queries == () and turn.errors


def test_query_budget_splits_the_calls():
    text = calls((1, "a"), (2, "b"), (3, "c"))
    turn = consult_turn(text, AGENT_CALLS_CLOSE, K, queries_left=1)
    assert [q.query for q in turn.queries] == ["a"]
    assert [q.query for q in turn.over_budget] == ["b", "c"] and turn.errors == ()
    spent = consult_turn(text, AGENT_CALLS_CLOSE, K, queries_left=0)
    assert spent.queries == () and len(spent.over_budget) == 3


def test_more_than_k_calls_and_unknown_ids_are_errors():
    turn = consult_turn(calls(*[(1, str(i)) for i in range(5)]), AGENT_CALLS_CLOSE, K, 10)
    assert len(turn.queries) == K and any("too many calls" in e for e in turn.errors)
    turn = consult_turn(calls((4, "x"), (2, "y")), AGENT_CALLS_CLOSE, K, 10)
    assert turn.queries == (ExpertQuery(2, "y"),) and "unknown expert id" in turn.errors[0]


# -- properties: raw policy output never raises, and malformed output is always an error

_ok_item = st.builds(
    lambda i, q: {"expert_id": i, "input_parameters": {"query": q}},
    st.integers(1, K),
    st.text(min_size=1, max_size=12).filter(str.strip),
)
_bad_id = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=K + 1),
    st.integers(2, 4000).map(lambda n: 10**n),  # json.dumps refuses > 4300 digits
    st.sampled_from(["１", "٣", "one", "", None, True, 1.5, [1], {"id": 1}]),
)
_bad_item = st.one_of(
    st.builds(lambda i: {"expert_id": i, "input_parameters": {"query": "q"}}, _bad_id),
    st.builds(
        lambda q: {"expert_id": 1, "input_parameters": {"query": q}},
        st.one_of(st.none(), st.integers(), st.just("  "), st.lists(st.text())),
    ),
    st.builds(
        lambda p: {"expert_id": 1, "input_parameters": p},
        st.one_of(st.none(), st.text(), st.integers(), st.just({})),
    ),
    st.just({"input_parameters": {"query": "q"}}),
    st.one_of(st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2)),
)
# Bodies that must each produce at least one error.
_bad_body = st.one_of(
    # A list holding at least one invalid item, among valid ones.
    st.tuples(st.lists(_ok_item, max_size=2), _bad_item, st.lists(_ok_item, max_size=2)).map(
        lambda t: json.dumps([*t[0], t[1], *t[2]], ensure_ascii=False)
    ),
    # More than K valid calls.
    st.lists(_ok_item, min_size=K + 1, max_size=K + 4).map(
        lambda items: json.dumps(items, ensure_ascii=False)
    ),
    # Broken JSON: a valid list cut short.
    st.lists(_ok_item, min_size=1, max_size=3)
    .map(json.dumps)
    .flatmap(lambda s: st.integers(1, len(s) - 1).map(lambda k: s[:k])),
    # Not a list of calls, nested too deep, numbers past the digit limit, empty.
    st.sampled_from(['"text"', "42", "null", "[]", "", "   ", "[" * 5000, "9" * 5000]),
    st.text(max_size=30).filter(lambda s: s.strip() and not s.strip().startswith(("[", "{"))),
)
_prose = st.text(max_size=40).filter(lambda s: "agent_calls" not in s)


@st.composite
def _malformed(draw) -> tuple[str, str | None]:
    """(policy text, stop reason) of a segment whose call is malformed."""
    prose = draw(_prose)
    kind = draw(st.sampled_from(["body", "unclosed", "no_open", "nested"]))
    if kind == "unclosed":  # the segment ran to EOS or its budget inside the block
        return prose + AGENT_CALLS_OPEN + draw(_bad_body | _ok_item.map(json.dumps)), None
    if kind == "no_open":
        return prose + AGENT_CALLS_CLOSE, AGENT_CALLS_CLOSE
    if kind == "nested":  # an outer open tag around a malformed inner block
        inner = AGENT_CALLS_OPEN * draw(st.integers(1, 3)) + draw(_bad_body)
        return prose + AGENT_CALLS_OPEN + "[" + inner + AGENT_CALLS_CLOSE, AGENT_CALLS_CLOSE
    return prose + AGENT_CALLS_OPEN + draw(_bad_body) + AGENT_CALLS_CLOSE, AGENT_CALLS_CLOSE


@settings(max_examples=1000, deadline=None)
@given(_malformed(), st.integers(-2, 12))
def test_malformed_calls_are_recorded_errors(case, queries_left):
    text, stop = case
    turn = consult_turn(text, stop, K, queries_left)
    assert turn.errors, text
    assert len(turn.queries) + len(turn.over_budget) <= K
    assert len(turn.queries) <= max(queries_left, 0)


_fragments = st.sampled_from(
    [
        AGENT_CALLS_OPEN,
        AGENT_CALLS_CLOSE,
        "[",
        "]",
        "{",
        "}",
        '"expert_id": ',
        "1",
        "7",
        ", ",
        '"input_parameters": {"query": "q"}',
        "9" * 5000,
        "é😀",
        "```json",
        "\n",
    ]
)
_any_text = st.one_of(st.text(), st.lists(_fragments | st.text(max_size=4)).map("".join))


@settings(max_examples=300, deadline=None)
@given(_any_text, st.sampled_from([AGENT_CALLS_CLOSE, None, "other"]), st.integers(-1, 12))
def test_any_text_gives_a_sane_turn(text, stop, queries_left):
    turn = consult_turn(text, stop, K, queries_left)
    assert turn.called == (stop == AGENT_CALLS_CLOSE)
    if not turn.called:
        assert turn.queries == turn.over_budget == ()
    assert len(turn.queries) <= max(queries_left, 0)
    for q in (*turn.queries, *turn.over_budget):
        assert 1 <= q.expert_id <= K and q.query.strip()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, K), st.none() | st.text()), max_size=5))
def test_returns_pieces_join_to_the_block(results):
    pieces = agent_returns_pieces(results)
    body = "".join(pieces)[len("<agent_returns>") : -len("</agent_returns>")]
    expected = [{"expert_id": e, "result": "unavailable" if r is None else r} for e, r in results]
    assert json.loads(body) == expected
    assert len(pieces) == 2 * len(results) + 1
    for (_, result), piece in zip(results, pieces[1::2], strict=True):
        assert piece == ("" if result is None else json.dumps(result, ensure_ascii=False)[1:-1])


def test_acceptance_draws():
    import random

    rng = random.Random(0)
    assert all(accepts(rng, 1.0) for _ in range(1000))
    assert not any(accepts(rng, 0.0) for _ in range(1000))
    share = sum(accepts(rng, 0.3) for _ in range(4000)) / 4000
    assert 0.25 < share < 0.35


def test_only_policy_text_is_searched_for_the_answer():
    episode = Episode("p", [1])
    episode.add(Segment(Author.POLICY, "I ask.\n" + calls((1, "q")), [2]))
    episode.add(Segment(Author.EXPERT, "Answer: 7", [3]))
    episode.add(Segment(Author.POLICY, "Still thinking", [4]))
    assert "Answer" not in policy_text(episode)


# ----------------------------------------------------------------------------- open mode


def test_consultation_transcript(smol_tokenizer, pool):
    before = pool.generate_calls
    episode, engine = run_one(
        smol_tokenizer,
        pool,
        ["<think>Two parts.</think>\n" + calls((1, "6 * 7?"), (3, "6 times 7?")), "Answer: 42"],
    )
    assert authors(episode) == "PEXEXEP"
    assert episode.answer == "42" and episode.end == "eos"
    assert pool.generate_calls == before + 1  # both calls, one batched generate
    experts = [s for s in episode.segments if s.author is Author.EXPERT]
    results = [(s.meta["expert_id"], json.loads(f'"{s.text}"')) for s in experts]
    [block] = returns_blocks(episode)
    assert block == "\n" + returns_block(results) + "\n"
    asked = [(1, "6 * 7?"), (3, "6 times 7?")]
    for segment, (expert_id, query) in zip(experts, asked, strict=True):
        assert segment.text
        assert segment.token_ids == smol_tokenizer.encode(segment.text, add_special_tokens=False)
        meta = segment.meta
        assert (meta["expert_id"], meta["query"], meta["outcome"]) == (expert_id, query, "ok")
        assert meta["accepted"] is True and meta["error"] is None and meta["latency_s"] > 0
        assert meta["endpoint"]
    # Token-id continuity: each turn saw exactly the prompt and every segment before it.
    assert engine.prompts == contexts_at_policy_turns(episode)
    # Loss only on the policy's tokens; the expert's tokens are help.
    mask = episode.loss_mask()
    assert sum(mask) == episode.tokens_by(Author.POLICY) < len(mask)
    expected = [int(s.author is Author.POLICY) for s in episode.segments for _ in s.token_ids]
    assert mask == expected
    helper = episode.tokens_by(Author.EXPERT)
    assert episode.call_ratio_realised() == pytest.approx(helper / len(episode.response_ids))
    meta = episode.meta
    assert (meta["expert_calls"], meta["expert_failures"], meta["rejected"]) == (2, 0, 0)
    assert (meta["format_errors"], meta["queries_sent"], episode.turns) == (0, 2, 2)


def test_rho_zero_rejects_every_answer(smol_tokenizer, pool):
    config = ConsultConfig(expert_max_tokens=6, accept_prob=0.0)
    episode, _ = run_one(smol_tokenizer, pool, [calls((1, "a"), (2, "b")), "Answer: 1"], config)
    experts = [s for s in episode.segments if s.author is Author.EXPERT]
    assert [s.text for s in experts] == ["", ""] and all(s.token_ids == [] for s in experts)
    assert all(s.meta["outcome"] == "ok" and not s.meta["accepted"] for s in experts)
    assert returns_blocks(episode)[0] == "\n" + returns_block([(1, None), (2, None)]) + "\n"
    assert (episode.meta["rejected"], episode.meta["expert_failures"]) == (2, 0)
    assert episode.meta["accept_prob"] == 0.0


def test_rho_draws_repeat_with_the_seed(smol_tokenizer, pool):
    config = ConsultConfig(expert_max_tokens=2, accept_prob=0.5)
    script = [calls((1, "a"), (2, "b"), (3, "c"))] * 3 + ["Answer: 1"]

    def accepted(seed: int) -> list[bool]:
        params = SamplingParams(max_tokens=800, seed=seed)  # room for all three turns
        episode, _ = run_one(smol_tokenizer, pool, script, config, params)
        return [s.meta["accepted"] for s in episode.calls]

    first = accepted(1)
    assert first == accepted(1) and len(first) == 9 and 0 < sum(first) < 9


def test_query_budget(smol_tokenizer, pool):
    config = ConsultConfig(expert_max_tokens=4, query_budget=2)
    script = [calls((1, "a"), (2, "b"), (3, "c")), calls((2, "d")), "Answer: 5"]
    episode, _ = run_one(smol_tokenizer, pool, script, config)
    outcomes = [(s.meta["query"], s.meta["outcome"], s.meta["error"]) for s in episode.calls]
    assert outcomes == [
        ("a", "ok", None),
        ("b", "ok", None),
        ("c", "unavailable", QUERY_BUDGET_SPENT),
        ("d", "unavailable", QUERY_BUDGET_SPENT),
    ]
    assert '"result": "unavailable"' in returns_blocks(episode)[1]
    meta = episode.meta
    assert (meta["queries_sent"], meta["over_budget"], meta["expert_failures"]) == (2, 2, 2)
    assert meta["expert_calls"] == 4 and episode.answer == "5"


def test_turn_budget_ends_a_calling_episode(smol_tokenizer, pool):
    config = ConsultConfig(expert_max_tokens=4, turn_budget=2)
    script = [calls((1, "a")), calls((2, "b")), "Answer: never"]
    episode, engine = run_one(smol_tokenizer, pool, script, config)
    assert authors(episode) == "PEXEP" and episode.turns == 2
    assert episode.end == "turn_budget" and episode.answer is None
    assert episode.segments[-1].text.endswith(AGENT_CALLS_CLOSE)
    assert episode.segments[-1].meta["unanswered"] == "turn_budget"
    assert [s.meta["query"] for s in episode.calls] == ["a"]  # the last call is not asked
    assert len(engine.prompts) == 2


def test_format_errors_are_recorded_and_the_episode_goes_on(smol_tokenizer, pool):
    broken = AGENT_CALLS_OPEN + '[{"expert_id": 9, "input_parameters": {"query": "x"}}, {'
    episode, _ = run_one(smol_tokenizer, pool, [broken + AGENT_CALLS_CLOSE, "Answer: 3"])
    first = episode.segments[0]
    assert first.meta["call_errors"] and first.meta["call_errors"][0].startswith("invalid JSON")
    assert authors(episode) == "PEP"
    assert returns_blocks(episode) == ["\n" + returns_block([]) + "\n"]
    assert episode.meta["format_errors"] == 1 and episode.meta["expert_calls"] == 0
    assert episode.answer == "3" and episode.end == "eos"


def test_unknown_ids_are_errors_and_the_valid_calls_are_answered(smol_tokenizer, pool):
    episode, _ = run_one(smol_tokenizer, pool, [calls((7, "x"), (2, "y")), "Answer: 1"])
    assert episode.segments[0].meta["call_errors"] == ["item 1: unknown expert id 7"]
    assert [s.meta["expert_id"] for s in episode.calls] == [2]
    assert episode.meta["format_errors"] == 1


def test_failed_expert_reads_unavailable(smol_tokenizer, tmp_path):
    broken = ExpertPool(PoolConfig(endpoints=[str(tmp_path / "missing")], num_experts=K))
    with broken:
        episode, _ = run_one(smol_tokenizer, broken, [calls((1, "a")), "Answer: 2"])
    [call] = episode.calls
    assert call.text == "" and call.meta["outcome"] == "unavailable" and call.meta["error"]
    assert not call.meta["accepted"]
    assert returns_blocks(episode)[0] == "\n" + returns_block([(1, None)]) + "\n"
    assert (episode.meta["expert_failures"], episode.meta["rejected"]) == (1, 0)
    assert episode.answer == "2"


def test_reference_expert_returns_the_gold_answer(smol_tokenizer):
    config = PoolConfig(endpoints=[REFERENCE], num_experts=K)
    policy, _ = scripted(smol_tokenizer, [calls((2, "6 * 7?")), "Answer: 42"])
    task = Task("p", "What is 6 * 7?", reference=Reference("42"))
    with ExpertPool(config, tokenizer=smol_tokenizer) as experts:
        [episode] = ConsultProtocol(policy, experts, ConsultConfig()).run([task], PARAMS)
    [call] = episode.calls
    assert call.meta["outcome"] == "ok" and call.meta["endpoint"] == "reference (stand-in)"
    [block] = returns_blocks(episode)
    reply = "The final answer is $\\boxed{42}$."
    assert block == "\n" + returns_block([(2, reply)]) + "\n"
    assert block.strip().startswith(AGENT_RETURNS_OPEN) and "boxed{42}" in block
    assert episode.answer == "42"


def test_answers_cut_at_expert_max_tokens_are_counted(smol_tokenizer):
    """Issue 50: a QwQ-style expert stopped at its cap mid-thought is recorded as such,
    per call and per episode, and the share runs over answers, not episodes. The
    reference stand-in writes "The final answer is $\\boxed{ANSWER}$.": a cap that holds
    the reply for 42 cuts the one for a longer answer."""
    reply = "The final answer is $\\boxed{42}$."
    cap = len(smol_tokenizer(reply, add_special_tokens=False)["input_ids"])
    config = ConsultConfig(expert_max_tokens=cap)
    policy, _ = scripted(
        smol_tokenizer, [calls((1, "q")), calls((1, "q"), (2, "q"))] + ["Answer: 1"] * 2
    )
    tasks = [
        Task("short", "What is 6 * 7?", reference=Reference("42")),
        Task("long", "What is 3 ** 40?", reference=Reference("12157665459056928801")),
    ]
    pool_config = PoolConfig(endpoints=[REFERENCE], num_experts=K)
    with ExpertPool(pool_config, tokenizer=smol_tokenizer) as experts:
        short, long = ConsultProtocol(policy, experts, config).run(tasks, PARAMS)
    assert [c.meta["truncated"] for c in short.calls] == [False]
    assert [c.meta["truncated"] for c in long.calls] == [True, True]
    assert (short.meta["expert_answers"], short.meta["expert_truncated"]) == (1, 0)
    assert (long.meta["expert_answers"], long.meta["expert_truncated"]) == (2, 2)
    assert truncated_share([short, long]) == pytest.approx(2 / 3)  # not (0 + 1) / 2
    assert truncated_share([short]) == 0.0


def test_no_answer_no_truncated_share(smol_tokenizer, tmp_path):
    """An episode that never asked, or whose experts all failed, has no share to log."""
    broken = ExpertPool(PoolConfig(endpoints=[str(tmp_path / "missing")], num_experts=K))
    with broken:
        failed, _ = run_one(smol_tokenizer, broken, [calls((1, "a")), "Answer: 2"])
    alone, _ = run_one(smol_tokenizer, None, ["Answer: 2"], ConsultConfig(mode="locked"))
    assert [c.meta["truncated"] for c in failed.calls] == [False]
    assert truncated_share([failed, alone]) is None


def test_token_budget_bounds_every_author(smol_tokenizer, pool):
    call = calls((1, "a"), (2, "b"))
    call_tokens = len(smol_tokenizer(call, add_special_tokens=False)["input_ids"])
    # Room for the call but not for the returns block: the episode ends, within budget.
    params = SamplingParams(max_tokens=call_tokens + 5, seed=0)
    episode, _ = run_one(smol_tokenizer, pool, [call, "Answer: 1"], params=params)
    assert authors(episode) == "P" and episode.end == "length"
    assert episode.segments[0].meta["unanswered"] == "length"
    assert len(episode.response_ids) <= params.max_tokens
    # A policy that runs out mid-thought ends at "length" too.
    episode, _ = run_one(smol_tokenizer, pool, ["word " * 50], params=SamplingParams(max_tokens=10))
    assert episode.end == "length" and len(episode.response_ids) == 10


def test_batched_rounds_over_several_episodes(smol_tokenizer, pool):
    scripts = {
        "alpha?": [calls((1, "a")), calls((2, "a2"), (3, "a3")), "Answer: A"],
        "beta?": ["Answer: B"],
        "gamma?": [calls((3, "g")), "Answer: G"],
    }

    def reply(prompt: list[int]) -> str:
        text = smol_tokenizer.decode(prompt)
        question = next(q for q in scripts if q in text)
        turn = text.split("<|im_start|>assistant")[-1].count(AGENT_RETURNS_OPEN)
        return scripts[question][turn]

    engine = RecordingEngine(ScriptedEngine(smol_tokenizer, reply))
    protocol = ConsultProtocol(Policy(engine, smol_tokenizer), pool, FAST)
    before = pool.generate_calls
    tasks = [Task(q, q) for q in scripts]
    episodes = protocol.run(tasks, PARAMS)
    assert [e.answer for e in episodes] == ["A", "B", "G"]
    assert [e.turns for e in episodes] == [3, 1, 2]
    # One policy generate per turn of every running episode, one pool generate per round
    # that had calls (rounds 1 and 2): the experts' calls were batched across episodes.
    assert len(engine.prompts) == 6 and pool.generate_calls == before + 2
    for episode in episodes:
        for context in contexts_at_policy_turns(episode):
            assert context in engine.prompts
    assert [e.meta["expert_calls"] for e in episodes] == [3, 0, 1]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=_malformed())
def test_malformed_policy_output_through_the_protocol(smol_tokenizer, pool, case):
    text, _ = case  # the scripted engine stops at </agent_calls> by itself
    episode, engine = run_one(smol_tokenizer, pool, [text, "Answer: 1"])
    assert episode.meta["format_errors"] >= 1
    assert episode.segments[0].meta["call_errors"]
    assert len(episode.response_ids) <= PARAMS.max_tokens
    assert engine.prompts == contexts_at_policy_turns(episode)
    assert episode.end in ("eos", "length", "turn_budget")


def test_real_tiny_policy_under_a_spy(smol_tokenizer, pool, tiny_engine):
    spy = RecordingEngine(tiny_engine)
    protocol = ConsultProtocol(Policy(spy, smol_tokenizer), pool, FAST)
    tasks = [Task("a", "2 + 2?"), Task("b", "3 + 5?", sample=1)]
    episodes = protocol.run(tasks, SamplingParams(max_tokens=24, temperature=1.0, seed=3))
    for episode in episodes:
        assert episode.segments[0].author is Author.POLICY
        assert len(episode.response_ids) <= 24
        assert episode.end in ("eos", "length", "turn_budget")
        for context in contexts_at_policy_turns(episode):
            assert context in spy.prompts
    assert episodes[0].prompt_ids == Policy(spy, smol_tokenizer).prompt_ids(
        training_prompt(K, 10).messages("2 + 2?")
    )


# ----------------------------------------------------------------------------- locked mode


def test_locked_mode_is_one_turn_without_experts(smol_tokenizer):
    reply = calls((1, "q")) + "\nAnswer: 3"
    policy, engine = scripted(smol_tokenizer, [reply])
    protocol = ConsultProtocol(policy, None, ConsultConfig(mode="locked"))
    [episode] = protocol.run([Task("p", "1 + 2?")], PARAMS)
    assert authors(episode) == "P" and episode.answer == "3"
    assert episode.meta["attempted_calls"] is True and episode.end == "eos"
    assert episode.meta["expert_calls"] == 0
    assert episode.prompt_ids == policy.prompt_ids(get_prompt("eapo-eval").messages("1 + 2?"))
    assert engine.prompts == [episode.prompt_ids]  # no stop on calls: one turn
    [plain] = protocol.run([Task("p", "1 + 2?")], PARAMS)  # the script has run out: ""
    assert plain.meta["attempted_calls"] is False


def test_extract_fallback_is_appended(smol_tokenizer):
    policy, _ = scripted(smol_tokenizer, ["so it is 12"])
    protocol = ConsultProtocol(policy, None, ConsultConfig(mode="locked"), ("last_number",))
    assert protocol.extract == ("answer_line", "boxed", "last_number")
    assert protocol.run([Task("p", "q")], PARAMS)[0].answer == "12"


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "changes",
    [
        {"mode": "closed"},
        {"num_experts": 0},
        {"query_budget": -1},
        {"turn_budget": 0},
        {"accept_prob": 1.5},
        {"expert_max_tokens": 0},
        {"expert_temperature": -1.0},
        {"expert_timeout": 0.0},
        {"self_collab": True, "mode": "locked"},
    ],
)
def test_bad_configs_are_user_errors(changes):
    with pytest.raises(UserError):
        ConsultConfig(**changes).check()


def test_open_mode_needs_a_pool_of_k_experts(smol_tokenizer, tiny_model_dir):
    policy, _ = scripted(smol_tokenizer, [])
    with pytest.raises(UserError, match="needs an expert pool"):
        ConsultProtocol(policy, None, ConsultConfig())
    two = ExpertPool(PoolConfig(endpoints=[str(tiny_model_dir)], num_experts=2))
    with pytest.raises(UserError, match="pool has 2"):
        ConsultProtocol(policy, two, ConsultConfig())
    ConsultProtocol(policy, two, ConsultConfig(num_experts=2, self_collab=True)).close()
    with pytest.raises(RuntimeError, match="closed"):  # close() closed the pool too
        asyncio.run(two.ask([], SamplingParams()))


# ----------------------------------------------------------------------------- end to end


def test_smollm2_policy_and_expert_over_a_real_server(smol_tokenizer):
    with ServerProcess(EMBEDDED) as server:
        pool = ExpertPool(PoolConfig(endpoints=[server.url], num_experts=K, timeout=120))
        config = ConsultConfig(expert_max_tokens=16)
        policy = Policy.load(EMBEDDED, EngineConfig())
        protocol = ConsultProtocol(policy, pool, config)
        params = SamplingParams(max_tokens=48, seed=0)
        [episode] = protocol.run([Task("e2e", "What is 2 + 3?")], params)
        assert episode.segments[0].author is Author.POLICY and episode.segments[0].text
        assert len(episode.response_ids) <= 48
        assert episode.end in ("eos", "length", "turn_budget")
        # SmolLM2 rarely calls on its own, so a scripted turn makes sure the server's
        # answers reach the returns block through the same pool.
        scripted_policy, _ = scripted(smol_tokenizer, [calls((1, "2 + 3?"), (2, "3 + 2?")), ""])
        [called] = ConsultProtocol(scripted_policy, pool, config).run(
            [Task("e2e", "What is 2 + 3?")], SamplingParams(max_tokens=200, seed=0)
        )
        answers = called.calls
        assert [a.meta["outcome"] for a in answers] == ["ok", "ok"]
        assert all(a.text and a.meta["endpoint"].endswith(server.url) for a in answers)
        block = returns_blocks(called)[0]
        assert block.startswith("\n" + AGENT_RETURNS_OPEN)
        assert block.rstrip().endswith(AGENT_RETURNS_CLOSE)
        protocol.close()


# ----------------------------------------------------------------------------- what is graded


def test_an_answer_written_inside_a_call_is_not_the_policys_answer(smol_tokenizer, pool):
    """Issue 32: a query that reads "Answer: 42", never answered (the turn budget ends
    the episode at the call), scored F1 1 and reward 1; it is a question, not an answer."""
    from collabrl.data.benchmarks import Item
    from collabrl.rewards.eapo import eapo_reward
    from collabrl.train.rollout import episode_extras

    config = ConsultConfig(expert_max_tokens=6, turn_budget=1)
    episode, _ = run_one(smol_tokenizer, pool, [calls((1, "Please verify. Answer: 42"))], config)
    assert episode.end == "turn_budget" and episode.answer is None
    extras = episode_extras(episode, Item("p", "What is 6 * 7?", "42", None))
    assert (extras["f1"], extras["format_ok"], extras["correct"]) == (0.0, False, False)
    assert eapo_reward(extras["f1"], extras["format_ok"]) == 0.0


def test_an_answer_after_a_call_block_still_counts(smol_tokenizer, pool):
    script = [
        calls((1, "Is it 41? Answer: 41")),
        "The experts disagree; I computed it.\nAnswer: 42",
    ]
    episode, _ = run_one(smol_tokenizer, pool, script)
    assert episode.answer == "42" and episode.end == "eos"


def test_returns_the_policy_writes_itself_are_not_its_answer():
    """An engine that ignores the stop string lets the policy invent the experts' returns:
    their "Answer:" lines are not the policy's either."""
    episode = Episode("p", [1])
    invented = returns_block([(1, "Answer: 42")])
    episode.add(Segment(Author.POLICY, calls((1, "q")) + "\n" + invented + "\nHmm.", [2]))
    assert "42" not in policy_text(episode) and policy_text(episode).strip() == "Hmm."


def test_an_unclosed_call_block_is_not_read_for_an_answer():
    episode = Episode("p", [1])
    episode.add(Segment(Author.POLICY, f'{AGENT_CALLS_OPEN}\n[{{"query": "Answer: 42', [2]))
    assert policy_text(episode) == ""


# ----------------------------------------------------------------------------- turn arithmetic


def test_a_budget_that_cannot_hold_one_full_turn_is_refused():
    """Issue 32: 3 experts × 8192-token answers in a 20480-token episode: asking every
    expert ended the episode with no returns. The error names the numbers."""
    paper = ConsultConfig(expert_max_tokens=8192)
    with pytest.raises(UserError, match=r"sampling.max_tokens 20480 .* 24784 tokens: 3 .* 8192"):
        check_turn_fits(paper, 20480)
    check_turn_fits(ConsultConfig(expert_max_tokens=4096), 20480)
    check_turn_fits(dataclasses.replace(paper, mode="locked"), 20480)  # no experts to ask
    assert turn_tokens(paper) == 3 * (8192 + CALL_TOKENS) + ANSWER_TOKENS


def test_a_budget_of_one_full_turn_holds_the_turn(smol_tokenizer, pool):
    """The arithmetic is what the protocol needs: at exactly `turn_tokens`, a K-expert
    call with a one-line query gets its answers back and the policy still answers."""
    config = ConsultConfig(expert_max_tokens=6)
    query = "Find the minimal n guaranteeing the second player can remove 2 cards."
    script = [calls(*[(k, query) for k in range(1, K + 1)]), "Answer: 42"]
    params = SamplingParams(max_tokens=turn_tokens(config), seed=0)
    check_turn_fits(config, params.max_tokens)
    episode, _ = run_one(smol_tokenizer, pool, script, config, params)
    assert len(episode.calls) == K and episode.end == "eos" and episode.answer == "42"
