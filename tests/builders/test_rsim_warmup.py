"""The rSIM warm-up builder: which samples are kept (step format, incorrect), the stop at
N rows, the five-shot prompt, resume, and rows that SFTTrainer reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from collabrl.builders.folder import ROWS, STATS
from collabrl.builders.policy import OVERSIZED
from collabrl.builders.rsim_warmup import (
    EXAMPLES,
    FEW_SHOT_PROMPT,
    RsimWarmupConfig,
    build_rsim_warmup,
    steps_of,
)
from collabrl.config import SamplingConfig
from collabrl.data.benchmarks import MAX_PROBLEM_CHARS
from collabrl.engines.base import Prompt
from collabrl.protocols.strategy import STEP_PROMPT
from collabrl.runs import DATASET
from tests.builders.sft import train_one_step
from tests.protocols.scripted import ScriptedEngine

WRONG = "First add the tens.\n\nThen add the ones.\n\nSo the sum is $\\boxed{1000}$."
RIGHT = "I count on.\n\nThe answer is $\\boxed{{{answer}}}$."
ONE_STEP = "The answer is $\\boxed{7}$."
NO_BOX = "Add them.\n\nThe answer is seven."


def _reply(tokenizer):
    """A reasoner whose reply depends on the problem's family (see data/arith_test.jsonl)."""
    answers = {}
    for line in Path("data/arith_test.jsonl").read_text().splitlines():
        row = json.loads(line)
        answers[row["problem"]] = row["answer"]

    def reply(prompt: Prompt) -> str:
        text = tokenizer.decode(prompt)
        problem = next(p for p in answers if p in text)
        family = re.search(r"(\d+) ([-+×÷]) ", problem)
        op = family.group(2) if family else "?"
        return {
            "+": WRONG,
            "-": RIGHT.format(answer=answers[problem]),
            "×": ONE_STEP,
        }.get(op, NO_BOX)

    return reply


def _config(out: Path, **changes) -> RsimWarmupConfig:
    fields = {
        "data": "arith",
        "limit": 60,
        "rows": 1000,
        "out": str(out),
        "sampling": SamplingConfig(max_tokens=64, seed=5),
    }
    return RsimWarmupConfig(**(fields | changes))


def test_the_prompt_shows_five_examples_with_blank_line_steps() -> None:
    messages = FEW_SHOT_PROMPT.messages("What is 2 + 2?")
    assert messages[0] == {"role": "system", "content": STEP_PROMPT.system}
    shots = messages[1:-1]
    assert len(shots) == 2 * len(EXAMPLES) == 10
    for asked, worked in zip(shots[::2], shots[1::2], strict=True):
        assert asked["role"] == "user" and worked["role"] == "assistant"
        assert len(steps_of(worked["content"])) >= 3 and "\\boxed{" in worked["content"]
    assert messages[-1] == {"role": "user", "content": "What is 2 + 2?"}


def test_only_incorrect_step_formatted_samples_become_rows(smol_tokenizer, tmp_path) -> None:
    engine = ScriptedEngine(smol_tokenizer, _reply(smol_tokenizer))
    result = build_rsim_warmup(_config(tmp_path), engine=engine)
    rows = [json.loads(line) for line in (tmp_path / ROWS).read_text().splitlines()]
    problems = [row["prompt"][-1]["content"] for row in rows]
    assert rows and all(" + " in p for p in problems)  # the wrong, formatted family only
    for row in rows:
        assert row["completion"] == [{"role": "assistant", "content": WRONG}]
        assert row["prompt"][0]["content"] == STEP_PROMPT.system  # no shots in the rows
        assert row["steps"] == 3 and row["answer"] == "1000"
    stats = json.loads((tmp_path / STATS).read_text())
    assert stats["rows"] == len(rows) and not stats["complete"]
    assert set(stats["rejected"]) == {
        "correct (it would teach the solution)",
        "fewer than 2 steps",
        "no \\boxed{} answer in the last step",
    }
    assert stats["sampled"] == 60 == result.new_samples
    # Every sample was asked with the five-shot prompt.
    assert all(EXAMPLES[0][0] in smol_tokenizer.decode(p) for p in engine.prompts)


def test_rows_train_with_trl_sft_trainer(smol_tokenizer, tiny_model_dir: Path, tmp_path) -> None:
    import datasets

    engine = ScriptedEngine(smol_tokenizer, lambda prompt: WRONG)
    build_rsim_warmup(_config(tmp_path / "w", limit=4), engine=engine)
    train_one_step(datasets.load_from_disk(str(tmp_path / "w" / DATASET)), tiny_model_dir, tmp_path)


def test_sampling_stops_at_the_rows_wanted_and_resumes_to_more(smol_tokenizer, tmp_path) -> None:
    engine = ScriptedEngine(smol_tokenizer, _reply(smol_tokenizer))
    build_rsim_warmup(_config(tmp_path, rows=3, limit=200), engine=engine)
    assert len((tmp_path / ROWS).read_text().splitlines()) == 3
    sent = len(engine.prompts)
    assert sent < 200  # stopped early
    # `rows` is not part of the experiment: asking for more continues the same folder.
    build_rsim_warmup(_config(tmp_path, rows=5, limit=200), engine=engine)
    rows = (tmp_path / ROWS).read_text().splitlines()
    assert len(rows) == 5 and len({json.loads(r)["item_id"] for r in rows}) == 5


def test_a_sample_cut_by_max_tokens_does_not_follow_the_format(smol_tokenizer, tmp_path) -> None:
    engine = ScriptedEngine(smol_tokenizer, lambda prompt: WRONG)
    build_rsim_warmup(
        _config(tmp_path, limit=4, sampling=SamplingConfig(max_tokens=6)), engine=engine
    )
    stats = json.loads((tmp_path / STATS).read_text())
    assert stats["rows"] == 0 and stats["rejected"] == {"did not finish (length)": 4}


@pytest.mark.slow
def test_the_embedded_model_builds_rows_on_arith(tmp_path) -> None:
    config = _config(
        tmp_path,
        data="arith_train",
        limit=16,
        rows=2,
        sampling=SamplingConfig(max_tokens=96, temperature=1.0),
    )
    result = build_rsim_warmup(config)
    assert result.stats["sampled"] > 0
    assert (tmp_path / "stats.png").is_file()


def test_a_problem_over_the_size_bound_is_rejected_unsampled(smol_tokenizer, tmp_path) -> None:
    data = tmp_path / "data.jsonl"
    rows = [
        {"id": "huge", "problem": "1 + " * (MAX_PROBLEM_CHARS // 4) + "1", "answer": "1"},
        {"id": "small", "problem": "What is 2 + 2?", "answer": "5"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    engine = ScriptedEngine(smol_tokenizer, lambda prompt: WRONG)
    config = _config(tmp_path / "w", data=str(data), limit=None, rows=5)

    first = build_rsim_warmup(config, engine=engine)
    again = build_rsim_warmup(config, engine=engine)  # resumed: nothing left to sample

    assert len(engine.prompts) == 1  # the small problem's
    assert first.stats["rejected"] == {OVERSIZED: 1} and first.stats["rows"] == 1
    assert again.new_samples == 0 and again.stats["rejected"] == {OVERSIZED: 1}
