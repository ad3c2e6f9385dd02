"""The consult warm-up builder: call rows the consult parser reads back, read rows that are
the protocol's own context after the returns, answer rows EAPO's format check accepts, the
call share, the consult training prompt, determinism, resume, and rows SFTTrainer takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl.builders.consult_warmup import (
    ConsultWarmupConfig,
    build_consult_warmup,
    call_completion,
    training_rows,
)
from collabrl.builders.folder import PLOT, ROWS, STATS
from collabrl.config import EngineConfig, PoolConfig, SamplingConfig
from collabrl.engines.base import SamplingParams, encode_prompt
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import Reference
from collabrl.errors import UserError
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.consult import ConsultConfig, ConsultProtocol, training_prompt
from collabrl.protocols.parsing import ExpertQuery, parse_agent_calls
from collabrl.rewards.eapo import format_ok
from collabrl.runs import DATASET
from tests.builders.sft import train_one_step
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
