"""The consult warm-up builder: call rows the consult parser reads back, read and refused
rows that are the protocol's own context after accepted and refused returns, refused rows
that go on to a right answer, answer rows EAPO's format check accepts, the call share and
the `fails_alone` rule, the consult training prompt, determinism, resume, and rows
SFTTrainer takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl.builders.consult_warmup import (
    ConsultWarmupConfig,
    build_consult_warmup,
    call_completion,
    decide,
    training_rows,
)
from collabrl.builders.folder import PLOT, ROWS, STATS
from collabrl.config import EngineConfig, PoolConfig, SamplingConfig
from collabrl.data.benchmarks import Item, load_benchmark
from collabrl.engines.base import SamplingParams, encode_prompt
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import Reference
from collabrl.errors import UserError
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.consult import ConsultConfig, ConsultProtocol, training_prompt
from collabrl.protocols.parsing import ExpertQuery, parse_agent_calls
from collabrl.protocols.sampling import Unit
from collabrl.rewards.eapo import format_ok
from collabrl.runs import DATASET
from tests.builders.sft import train_one_step
from tests.eval.evidence import load_script
from tests.protocols.scripted import ScriptedEngine

BOXED = "8 + 6 makes 14, so the sum is \\boxed{14}."
ANSWERED = "Count on from 8.\nAnswer: 14"
NO_ANSWER = "I am not sure what to do here."
LONG = "Let me count: " + " ".join(str(i) for i in range(200))


def _rows(folder: Path) -> list[dict]:
    """The training rows: a call's line of rows.jsonl holds its read row too."""
    lines = [json.loads(line) for line in (folder / ROWS).read_text().splitlines()]
    return [row for line in lines for row in training_rows(line)]


def _config(out: Path, model: str = "smollm2-135m", **changes) -> ConsultWarmupConfig:
    fields = {
        "model": model,
        "data": "arith",
        "limit": 8,
        "out": str(out),
        "sampling": SamplingConfig(max_tokens=48, temperature=1.0, seed=3),
        "engine": EngineConfig(batch_size=4),
    }
    return ConsultWarmupConfig(**(fields | changes))


def _scripted(smol_tokenizer, reply: str = BOXED) -> ScriptedEngine:
    return ScriptedEngine(smol_tokenizer, lambda prompt: reply)


def test_defaults_are_the_consult_protocols() -> None:
    consult, config = ConsultConfig(), ConsultWarmupConfig()
    assert (config.num_experts, config.query_budget) == (consult.num_experts, consult.query_budget)


@pytest.mark.parametrize("problem", ["What is 8 + 6?", '  Quote "this" \\ and </agent_calls>\n'])
def test_a_call_completion_parses_back_to_the_problem(problem: str) -> None:
    text = call_completion(problem, 2)
    assert text.startswith("<agent_calls>\n") and text.endswith("\n</agent_calls>")
    calls = parse_agent_calls(text, num_experts=3, max_calls=3)
    assert calls.ok and calls.queries == (ExpertQuery(2, problem.strip()),)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"call_fraction": 1.5}, "call_fraction must be in [0, 1]"),
        ({"call_fraction": -0.1}, "call_fraction must be in [0, 1]"),
        ({"refused_fraction": 1.5}, "refused_fraction must be in [0, 1]"),
        ({"call_when": "sometimes"}, "call_when must be random or fails_alone"),
        ({"num_experts": 0}, "num_experts must be between 1 and 1024"),
        ({"num_experts": 10**9}, "num_experts must be between 1 and 1024"),
        ({"query_budget": 0}, "query_budget must be at least 1"),
        ({"prompt": "no-such-prompt"}, "no-such-prompt"),
        ({"expert": "reference@2"}, "reference@2"),
    ],
)
def test_bad_values_are_refused_before_any_folder(changes, fragment, tmp_path) -> None:
    with pytest.raises(UserError, match=fragment.replace("[", r"\[")):
        build_consult_warmup(_config(tmp_path / "out", **changes))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("fraction", "kinds", "rows"), [(0.0, {"answer"}, 8), (1.0, {"call", "read"}, 16)]
)
def test_call_fraction_zero_and_one(smol_tokenizer, tmp_path, fraction, kinds, rows) -> None:
    build_consult_warmup(
        _config(tmp_path, call_fraction=fraction), engine=_scripted(smol_tokenizer)
    )
    written = _rows(tmp_path)
    assert len(written) == rows and {r["kind"] for r in written} == kinds
    stats = json.loads((tmp_path / STATS).read_text())
    assert stats["call_share"] == fraction and stats["rows"] == rows


def test_a_call_is_read_back_as_the_protocol_holds_it(smol_tokenizer, tmp_path) -> None:
    """The read row, tokenized as TRL tokenizes a text row, is the token sequence the
    consult protocol samples: the call, the returns block, then the answer line."""
    build_consult_warmup(
        _config(tmp_path, call_fraction=1.0, limit=1, expert="reference@0.5"),
        engine=_scripted(smol_tokenizer),
    )
    call, read = _rows(tmp_path)
    assert (call["kind"], read["kind"]) == ("call", "read")
    assert (
        read["prompt"]
        == call["prompt"]
        + call["completion"]
        + read["prompt"][len(call["prompt"]) + len(call["completion"]) :]
    )
    problem = json.loads(_arith()[0])
    task = Task(
        problem["id"], problem["problem"], reference=Reference(problem["answer"], key=problem["id"])
    )
    policy = Policy(
        ScriptedEngine(smol_tokenizer, [call["completion"], read["completion"]]), smol_tokenizer
    )
    pool = ExpertPool(
        PoolConfig(endpoints=["reference@0.5"], num_experts=3), tokenizer=smol_tokenizer
    )
    with pool:
        config = ConsultConfig(expert_temperature=0.0)
        [episode] = ConsultProtocol(policy, pool, config).run(
            [task], SamplingParams(max_tokens=900, seed=3)
        )
    # The same text; the ids differ only where the expert's text and the JSON around it
    # merge into one token when tokenized whole (no loss falls there).
    text = read["prompt"] + read["completion"] + smol_tokenizer.eos_token
    assert smol_tokenizer.decode(episode.visible_ids) == text
    prompt_ids = smol_tokenizer(read["prompt"])["input_ids"]
    trl_ids = smol_tokenizer(text)["input_ids"]
    assert trl_ids[: len(prompt_ids)] == prompt_ids  # TRL's completion starts here
    assert trl_ids[len(prompt_ids) :] == episode.segments[-1].token_ids
    assert read["answer"] == episode.answer


def test_rows_are_asked_with_the_consult_training_prompt(smol_tokenizer, tmp_path) -> None:
    engine = _scripted(smol_tokenizer)
    build_consult_warmup(_config(tmp_path, num_experts=2, query_budget=4), engine=engine)
    rows = _rows(tmp_path)
    prompt = training_prompt(2, 4)
    problems = {json.loads(line)["id"]: json.loads(line)["problem"] for line in _arith()}
    for row in rows:
        start = encode_prompt(smol_tokenizer, prompt.messages(problems[row["item_id"]]))
        assert row["prompt"].startswith(smol_tokenizer.decode(start))
        assert row["prompt_tokens"] == len(smol_tokenizer(row["prompt"])["input_ids"])
    stats = json.loads((tmp_path / STATS).read_text())
    # A trainer's max_length must hold the long consult prompt and the completion.
    assert stats["row_tokens"]["max"] > stats["prompt_tokens"]["max"]
    assert stats["row_tokens"]["min"] > stats["prompt_tokens"]["min"] > 500
    # The policy answered with its own `prompt` (plain: the problem alone), not the consult one.
    assert all("panel of" not in smol_tokenizer.decode(p) for p in engine.prompts)
    calls = [r for r in rows if r["kind"] == "call"]
    assert calls and {r["expert_id"] for r in calls} <= {1, 2}
    for row in calls:
        parsed = parse_agent_calls(row["completion"], 2, 2)
        assert parsed.queries == (ExpertQuery(row["expert_id"], problems[row["item_id"]]),)


def _arith() -> list[str]:
    return Path("data/arith_test.jsonl").read_text().splitlines()[:8]


@pytest.mark.parametrize(
    ("reply", "completion", "answer"),
    [(BOXED, BOXED + "\nAnswer: 14", "14"), (ANSWERED, ANSWERED, "14")],
)
def test_answer_rows_end_in_the_answer_line_eapo_asks_for(
    smol_tokenizer, tmp_path, reply, completion, answer
) -> None:
    build_consult_warmup(
        _config(tmp_path, call_fraction=0.0), engine=_scripted(smol_tokenizer, reply)
    )
    for row in _rows(tmp_path):
        text = row["completion"]
        assert text == completion and format_ok(text)
        assert row["answer"] == answer and row["expert_id"] is None


@pytest.mark.parametrize(
    ("reply", "max_tokens", "reason"),
    [(NO_ANSWER, 48, "no extracted answer"), (LONG, 16, "cut by max_tokens")],
)
def test_responses_without_an_answer_are_rejected(
    smol_tokenizer, tmp_path, reply, max_tokens, reason
) -> None:
    sampling = SamplingConfig(max_tokens=max_tokens, seed=3)
    result = build_consult_warmup(
        _config(tmp_path, call_fraction=0.0, sampling=sampling),
        engine=_scripted(smol_tokenizer, reply),
    )
    assert result.stats["rows"] == 0 and result.stats["rejected"] == {reason: 8}
    assert (tmp_path / PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rows_train_with_trl_sft_trainer(smol_tokenizer, tiny_model_dir: Path, tmp_path) -> None:
    import datasets

    build_consult_warmup(_config(tmp_path / "w", limit=6), engine=_scripted(smol_tokenizer))
    data = datasets.load_from_disk(str(tmp_path / "w" / DATASET))
    assert set(data["kind"]) == {"call", "read", "answer"}
    train_one_step(data, tiny_model_dir, tmp_path)


# -- the three outcomes: accepted, refused, alone; and the call rule ------------------------


@pytest.fixture(scope="module")
def worked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight arith problems with worked solutions, as the evidence runs make them."""
    out = tmp_path_factory.mktemp("worked")
    load_script("arith_mix").main(["add1,mul22", "4", "1", str(out), "--solutions"])
    return out / "train.jsonl"


def _own(item: Item, right: bool) -> str:
    """The scripted policy's own response to an item: right or off by one."""
    answer = item.answer if right else str(int(item.answer) + 1)
    return f"Adding it up.\nAnswer: {answer}"


def _solving(smol_tokenizer, items: list[Item], solved: set[str]) -> ScriptedEngine:
    """A policy whose own answer is right on the items in `solved`, wrong on the rest."""

    def reply(prompt: list[int]) -> str:
        text = smol_tokenizer.decode(prompt)
        [item] = [item for item in items if f"\n{item.problem}<|im_end|>" in text]
        return _own(item, item.id in solved)

    return ScriptedEngine(smol_tokenizer, reply)


def _half_solved(smol_tokenizer, data: Path) -> tuple[list[Item], set[str], ScriptedEngine]:
    items = load_benchmark(str(data)).items
    solved = {item.id for item in items[::2]}
    return items, solved, _solving(smol_tokenizer, items, solved)


def test_a_refused_call_is_read_back_as_the_protocol_holds_it(
    smol_tokenizer, tmp_path, worked
) -> None:
    """The refused row is the token context the consult protocol samples in after ρ
    refused the answer: the call, returns that read unavailable, then the policy alone."""
    items, _, engine = _half_solved(smol_tokenizer, worked)
    config = _config(tmp_path, data=str(worked), limit=1, call_fraction=1.0, refused_fraction=1.0)
    build_consult_warmup(config, engine=engine)
    call, refused = _rows(tmp_path)
    assert (call["kind"], refused["kind"]) == ("call", "refused")
    assert refused["prompt"].startswith(call["prompt"] + call["completion"])
    assert '"result": "unavailable"' in refused["prompt"]
    item = items[0]
    policy = Policy(
        ScriptedEngine(smol_tokenizer, [call["completion"], refused["completion"]]),
        smol_tokenizer,
    )
    pool = ExpertPool(PoolConfig(endpoints=["reference"], num_experts=3), tokenizer=smol_tokenizer)
    with pool:
        config = ConsultConfig(accept_prob=0.0, expert_temperature=0.0)
        [episode] = ConsultProtocol(policy, pool, config).run(
            [Task(item.id, item.problem, reference=item.reference)],
            SamplingParams(max_tokens=900, seed=3),
        )
    [expert] = episode.calls
    assert expert.meta["outcome"] == "ok" and not expert.meta["accepted"]
    text = refused["prompt"] + refused["completion"] + smol_tokenizer.eos_token
    assert smol_tokenizer.decode(episode.visible_ids) == text
    prompt_ids = smol_tokenizer(refused["prompt"])["input_ids"]
    trl_ids = smol_tokenizer(text)["input_ids"]
    assert trl_ids[: len(prompt_ids)] == prompt_ids
    assert trl_ids[len(prompt_ids) :] == episode.segments[-1].token_ids
    assert refused["answer"] == episode.answer == item.answer


def test_after_a_refusal_the_policy_goes_on_to_a_right_answer(
    smol_tokenizer, tmp_path, worked
) -> None:
    """Its own response where that is right, else the item's worked solution: never a
    wrong answer to learn."""
    items, solved, engine = _half_solved(smol_tokenizer, worked)
    config = _config(tmp_path, data=str(worked), call_fraction=1.0, refused_fraction=1.0)
    result = build_consult_warmup(config, engine=engine)
    refused = {r["item_id"]: r for r in _rows(tmp_path) if r["kind"] == "refused"}
    assert len(refused) == len(items) == 8
    for item in items:
        row = refused[item.id]
        assert row["correct"] and row["answer"] == item.answer
        assert row["own"] == (item.id in solved)
        if item.id in solved:
            assert row["completion"] == _own(item, True)
        else:
            assert item.solution is not None and item.solution.count("\n") >= 1
            assert row["completion"] == f"{item.solution}\nAnswer: {item.answer}"
    stats = result.stats
    assert (stats["call_rows"], stats["read_rows"], stats["answer_rows"]) == (8, 0, 0)
    assert (stats["refused_rows"], stats["refused_own_rows"]) == (8, 4)


def test_without_a_solution_a_refused_row_ends_in_the_answer_alone(
    smol_tokenizer, tmp_path
) -> None:
    items = load_benchmark("arith", limit=8).items
    config = _config(tmp_path, call_fraction=1.0, refused_fraction=1.0)
    build_consult_warmup(config, engine=_solving(smol_tokenizer, items, set()))
    rows = [r for r in _rows(tmp_path) if r["kind"] == "refused"]
    assert [r["completion"] for r in rows] == [f"Answer: {item.answer}" for item in items]


def test_fails_alone_calls_exactly_where_the_own_answer_is_wrong(
    smol_tokenizer, tmp_path, worked
) -> None:
    """Whatever call_fraction says: the solved problems answer alone, the others call,
    and a share of those calls is refused."""
    items, solved, engine = _half_solved(smol_tokenizer, worked)
    config = _config(
        tmp_path,
        data=str(worked),
        call_when="fails_alone",
        call_fraction=0.0,
        refused_fraction=0.5,
        expert="reference-solution@0.5",
    )
    result = build_consult_warmup(config, engine=engine)
    rows = _rows(tmp_path)
    answers = {r["item_id"] for r in rows if r["kind"] == "answer"}
    calls = {r["item_id"] for r in rows if r["kind"] == "call"}
    assert answers == solved and calls == {item.id for item in items} - solved
    assert all(r["correct"] and r["own"] for r in rows if r["kind"] == "answer")
    after = [r for r in rows if r["kind"] in ("read", "refused")]
    assert {r["item_id"] for r in after} == calls
    stats = result.stats
    assert stats["refused_rows"] + stats["read_rows"] == stats["call_rows"] == 4
    assert stats["refused_own_rows"] == 0 and stats["answer_rows"] == 4
    assert stats["call_when"] == "fails_alone" and stats["call_share"] == 0.5
    # The teaching stand-in's text is in the read rows' prompts: steps to learn from.
    for read in (r for r in rows if r["kind"] == "read"):
        assert "= " in read["prompt"].rsplit("<agent_returns>", 1)[1]


def _units(count: int) -> list[Unit]:
    return [Unit(Item(f"item-{n}", "What is 1 + 1?", "2"), 0) for n in range(count)]


def test_the_draws_are_fixed_per_unit_and_a_refused_share_moves_no_call() -> None:
    units = _units(3000)
    before = ConsultWarmupConfig(call_fraction=0.5)
    after = ConsultWarmupConfig(call_fraction=0.5, refused_fraction=0.3)
    old = [decide(before, u, False) for u in units]
    new = [decide(after, u, False) for u in units]
    assert new == [decide(after, u, False) for u in units]
    # Which units call, and whom, are the draws of a build without refusals.
    assert [c and c.expert_id for c in old] == [c and c.expert_id for c in new]
    assert not any(c and c.refused for c in old)
    made = [c for c in new if c is not None]
    assert abs(len(made) / len(units) - 0.5) < 0.03
    assert abs(sum(c.refused for c in made) / len(made) - 0.3) < 0.04
    # fails_alone reads the own answer alone, with the same expert and refusal draws.
    failing = ConsultWarmupConfig(call_when="fails_alone", refused_fraction=0.3)
    assert all(decide(failing, u, True) is None for u in units)
    for unit, drawn in zip(units, new, strict=True):
        if drawn is not None:
            assert decide(failing, unit, False) == drawn


# -- whole builds with the tiny model --------------------------------------------------------


@pytest.fixture(scope="module")
def built(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("consult-warmup")
    build_consult_warmup(_config(out, str(tiny_model_dir)))
    return out


def test_a_build_writes_rows_dataset_stats_and_a_plot(built: Path) -> None:
    stats = json.loads((built / STATS).read_text())
    units = stats["call_rows"] + stats["answer_rows"] + sum(stats["rejected"].values())
    assert stats["units"] == units == 8
    assert stats["call_rows"] == stats["read_rows"] > 0
    assert stats["rows"] == units - sum(stats["rejected"].values()) + stats["read_rows"]
    assert stats["rows"] == len(_rows(built))
    assert (built / PLOT).is_file() and (built / DATASET / "dataset_info.json").is_file()


def test_the_same_seed_builds_the_same_rows(built: Path, tiny_model_dir: Path, tmp_path) -> None:
    build_consult_warmup(_config(tmp_path, str(tiny_model_dir)))
    assert (tmp_path / ROWS).read_text() == (built / ROWS).read_text()
    assert (tmp_path / "rejected.jsonl").read_text() == (built / "rejected.jsonl").read_text()


def test_a_killed_build_resumes_to_the_same_rows(
    built: Path, tiny_model_dir: Path, tmp_path
) -> None:
    lines = (built / ROWS).read_text().splitlines(keepends=True)
    (tmp_path / ROWS).write_text("".join(lines[:2]) + lines[2][:25])  # torn mid-line
    result = build_consult_warmup(_config(tmp_path, str(tiny_model_dir)))
    assert (tmp_path / ROWS).read_text() == (built / ROWS).read_text()
    assert result.new_samples == 8 - 2


def test_another_call_fraction_in_the_same_folder_is_refused(
    built: Path, tiny_model_dir: Path
) -> None:
    with pytest.raises(UserError, match="different call_fraction"):
        build_consult_warmup(_config(built, str(tiny_model_dir), call_fraction=0.2))
