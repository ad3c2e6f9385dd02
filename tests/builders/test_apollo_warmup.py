"""The apollo warm-up builder: traces whose last call printed the answer become call rows
and a boxed answer row, asked with the aid-free A.1 prompt; the apollo protocol run on
those rows' completions rebuilds the rows' own text; failed calls stay as error
correction; rejections; rows SFTTrainer takes. The policy is scripted, the sandbox real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl.builders.apollo_warmup import (
    ApolloWarmupConfig,
    build_apollo_warmup,
    training_rows,
)
from collabrl.builders.folder import PLOT, ROWS, STATS
from collabrl.config import EngineConfig, SamplingConfig
from collabrl.engines.base import Prompt, SamplingParams
from collabrl.errors import UserError
from collabrl.protocols.apollo import FORCED_OPENING, ApolloConfig, ApolloProtocol, build_router
from collabrl.protocols.base import Policy, Task
from collabrl.runs import DATASET
from tests.builders.sft import train_one_step
from tests.protocols.scripted import ScriptedEngine

# arith's first problems: 8 + 6 = 14, 83 + 31 = 114, 50 - 47 = 3, ...
FIRST = "What is 8 + 6? Put your final answer within \\boxed{}."


def _rows(folder: Path) -> list[dict]:
    lines = [json.loads(line) for line in (folder / ROWS).read_text().splitlines()]
    return [row for line in lines for row in training_rows(line)]


def _config(out: Path, **changes) -> ApolloWarmupConfig:
    fields = {
        "data": "arith",
        "limit": 1,
        "out": str(out),
        "sampling": SamplingConfig(max_tokens=200, temperature=1.0, seed=3),
        "engine": EngineConfig(batch_size=4),
    }
    return ApolloWarmupConfig(**(fields | changes))


def _call(code: str) -> str:
    """A call's JSON and closing tag: what the policy writes after the forced opening tag."""
    return json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


def _scripted(tokenizer, turns: list[str]) -> ScriptedEngine:
    """The policy writes turns[k] in its k-th turn of an episode (after k tool responses)."""

    def reply(prompt: Prompt) -> str:
        ids = prompt if isinstance(prompt, list) and isinstance(prompt[0], int) else None
        text = tokenizer.decode(ids) if ids is not None else str(prompt)
        answer = text.rsplit("<|im_start|>assistant", 1)[-1]
        return turns[min(answer.count("</tool_response>"), len(turns) - 1)]

    return ScriptedEngine(tokenizer, reply)


def test_a_trace_becomes_a_call_row_and_a_boxed_answer_row(smol_tokenizer, tmp_path) -> None:
    turns = [_call("print(8 + 6)"), "The sum is 14."]
    result = build_apollo_warmup(_config(tmp_path), engine=_scripted(smol_tokenizer, turns))
    call, answer = _rows(tmp_path)
    assert (call["kind"], answer["kind"]) == ("call", "answer")
    # The forced opening tag is the policy's own text in the row: it learns to open calls.
    assert call["completion"] == "<tool_call>\n" + _call("print(8 + 6)")
    assert answer["completion"] == "The answer is \\boxed{14}."
    response = "\n<tool_response>\n14\n</tool_response>\n"
    assert answer["prompt"] == call["prompt"] + call["completion"] + response
    # Asked with the A.1 prompt without the sampling aids (no worked example).
    assert "tools that you can use" in call["prompt"] and "For example" not in call["prompt"]
    assert call["prompt"].endswith(FIRST + "<|im_end|>\n<|im_start|>assistant\n")
    assert result.stats["traces"] == 1 and result.stats["rows"] == 2


def test_the_protocol_rebuilds_the_rows_from_their_completions(smol_tokenizer, tmp_path) -> None:
    """Training's protocol (no aids), its policy writing the rows' completions, holds the
    answer row's text exactly: SFT trains on the context `train grpo` samples in."""
    turns = [_call("print(8 + 6)"), "The sum is 14."]
    build_apollo_warmup(_config(tmp_path), engine=_scripted(smol_tokenizer, turns))
    call, answer = _rows(tmp_path)
    tools = ApolloConfig(tools=["python"])
    engine = ScriptedEngine(smol_tokenizer, [call["completion"], answer["completion"]])
    protocol = ApolloProtocol(Policy(engine, smol_tokenizer), build_router(tools), tools)
    try:
        [episode] = protocol.run([Task("p", FIRST)], SamplingParams(max_tokens=200, seed=3))
    finally:
        protocol.close()
    text = answer["prompt"] + answer["completion"] + smol_tokenizer.eos_token
    assert smol_tokenizer.decode(episode.visible_ids) == text
    assert episode.answer == "14"


def test_a_failed_call_and_its_fix_are_kept(smol_tokenizer, tmp_path) -> None:
    fix = "Fixing it.\n<tool_call>\n" + _call("print(8 + 6)")
    turns = [_call("print(8 +)"), fix, "14"]
    result = build_apollo_warmup(_config(tmp_path), engine=_scripted(smol_tokenizer, turns))
    first, second, answer = _rows(tmp_path)
    assert [r["kind"] for r in (first, second, answer)] == ["call", "call", "answer"]
    assert "Error" in second["prompt"][len(first["prompt"] + first["completion"]) :]
    assert second["completion"] == fix
    assert result.stats["traces_with_a_failed_call"] == 1


@pytest.mark.parametrize(
    ("turns", "aids", "reason"),
    [
        (["The sum is 14."], {"force_call": False}, "no tool call"),
        ([_call("print(8 +)"), "14"], {}, "last call failed (SyntaxError)"),
        ([_call("print(8 + 5)"), "13"], {}, "last call did not print the answer"),
    ],
)
def test_traces_without_a_right_last_call_are_rejected(
    smol_tokenizer, tmp_path, turns, aids, reason
) -> None:
    apollo = ApolloConfig(**({"tools": ["python"], "few_shot": True, "force_call": True} | aids))
    result = build_apollo_warmup(
        _config(tmp_path, apollo=apollo), engine=_scripted(smol_tokenizer, turns)
    )
    assert result.stats["rows"] == 0 and result.stats["rejected"] == {reason: 1}
    assert (tmp_path / PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


ISCLOSE = {
    "id": "docs-train-stdlib-0000",
    "problem": "What is the default value of the `rel_tol` parameter of math.isclose?",
    "answer": "1e-09",
    "answer_type": "math",
}


@pytest.mark.parametrize(
    ("query", "reason"),
    [("math.isclose rel_tol default", None), ("factorial of an integer", "did not show")],
)
def test_a_retrieve_trace_boxes_the_value_the_documentation_shows(
    smol_tokenizer, tmp_path, monkeypatch, query, reason
) -> None:
    """With aid_tool=retrieve the forced call is a retrieve call (its name written for the
    policy), and a trace is kept when the documentation it returned shows the answer."""
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path / "home"))
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps(ISCLOSE) + "\n")
    turn = f'math", "query": "{query}"}}}}\n</tool_call>'
    apollo = ApolloConfig(
        tools=["retrieve", "python"], few_shot=True, force_call=True, aid_tool="retrieve"
    )
    engine = _scripted(smol_tokenizer, [turn, "It is 1e-09."])
    # Room for the retrieved chunks (up to 2000 characters of code) after the call.
    sampling = SamplingConfig(max_tokens=1024, temperature=1.0, seed=3)
    config = _config(tmp_path / "w", data=str(data), apollo=apollo, sampling=sampling)
    result = build_apollo_warmup(config, engine=engine)
    sampled = smol_tokenizer.decode(engine.prompts[0])
    assert "max_denominator=1000000" in sampled  # the worked retrieve call
    if reason is not None:
        assert result.stats["rejected"] == {"last call did not show the answer": 1}
        return
    call, answer = _rows(tmp_path / "w")
    assert call["completion"] == FORCED_OPENING["retrieve"] + turn
    assert answer["completion"] == "The answer is \\boxed{1e-09}."
    assert "rel_tol=1e-09" in answer["prompt"] and "max_denominator" not in answer["prompt"]


def test_the_sampling_aids_do_not_reach_the_rows(smol_tokenizer, tmp_path) -> None:
    engine = _scripted(smol_tokenizer, [_call("print(8 + 6)"), "14"])
    build_apollo_warmup(_config(tmp_path), engine=engine)
    sampled = smol_tokenizer.decode(engine.prompts[0])
    assert "For example" in sampled and sampled.endswith("<tool_call>\n")
    assert all("For example" not in r["prompt"] for r in _rows(tmp_path))


def test_no_tools_is_refused_before_any_folder(tmp_path) -> None:
    with pytest.raises(UserError, match="no tools"):
        build_apollo_warmup(_config(tmp_path / "w", apollo=ApolloConfig(tools=[])))
    assert not (tmp_path / "w").exists()


def test_rows_train_with_trl_sft_trainer(smol_tokenizer, tiny_model_dir: Path, tmp_path) -> None:
    import datasets

    turns = [_call("print(8 + 6)"), "14"]
    build_apollo_warmup(_config(tmp_path / "w"), engine=_scripted(smol_tokenizer, turns))
    data = datasets.load_from_disk(str(tmp_path / "w" / DATASET))
    assert list(data["kind"]) == ["call", "answer"]
    stats = json.loads((tmp_path / "w" / STATS).read_text())
    assert stats["call_rows"] == stats["answer_rows"] == 1
    train_one_step(data, tiny_model_dir, tmp_path)
