"""Tests for `collabrl.builders.filter`: teacher filtering and decontamination.

The teacher is the real expert pool over a scripted engine (`ScriptedTeacher`) whose
sample s of problem P is right iff s < PLAN[P], so every pass rate is hand-counted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl.builders.decontaminate import NGRAM, words
from collabrl.builders.filter import FilterConfig, build_filter
from collabrl.config import EngineConfig, SamplingConfig
from collabrl.data.benchmarks import MAX_PROBLEM_CHARS, load_benchmark
from collabrl.engines.base import Completion, SamplingParams
from collabrl.errors import UserError
from collabrl.runs import read_records

SEED = 7
K = 4
# problem -> how many of its K samples are right: pass rates 1, 0.5, 0.25, 0
PLAN = {"What is one?": 4, "What is two?": 2, "What is three?": 1, "What is four?": 0}
ANSWERS = {"What is one?": "1", "What is two?": "2", "What is three?": "3", "What is four?": "4"}


class ScriptedTeacher:
    """An Engine answering sample s (seed SEED + s) right iff s < PLAN[problem]; a call
    holding a failing sample fails whole, as an engine's batch does."""

    name = "scripted-teacher"

    def __init__(self) -> None:
        self.fail_samples: frozenset[int] = frozenset()
        self.fail_problems: frozenset[str] = frozenset()
        self.calls = 0

    def generate(self, prompts: list, params: SamplingParams) -> list[list[Completion]]:
        self.calls += 1
        # The pool batches calls that differ only in their seed: each prompt has its own.
        samples = [params.prompt_seed(i) - SEED for i in range(len(prompts))]
        problems = {messages[-1]["content"] for messages in prompts}
        if self.fail_samples & set(samples) or self.fail_problems & problems:
            raise ValueError("teacher down")  # not transient: no retry
        out = []
        for messages, sample in zip(prompts, samples, strict=True):
            problem = messages[-1]["content"]
            right = sample < PLAN[problem]
            answer = ANSWERS[problem] if right else "99"
            out.append([Completion(f"So \\boxed{{{answer}}}.", [1, 2], finish_reason="stop")])
        return out

    def close(self) -> None:
        pass


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    rows = [
        {"id": f"p{i}", "problem": p, "answer": a, "solution": f"It is {a}."}
        for i, (p, a) in enumerate(ANSWERS.items())
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def teacher(monkeypatch: pytest.MonkeyPatch) -> ScriptedTeacher:
    """The pool's local engine for the teacher `smollm2-135m` becomes the scripted one."""
    engine = ScriptedTeacher()
    monkeypatch.setattr("collabrl.engines.pool.create_engine", lambda ref, config: engine)
    return engine


def config(data: Path, out: Path, **changes) -> FilterConfig:
    base = dict(
        teacher="smollm2-135m",
        data=str(data),
        out=str(out),
        k=K,
        sampling=SamplingConfig(max_tokens=16, temperature=1.0, seed=SEED),
    )
    return FilterConfig(**(base | changes))


def rates(out: Path) -> dict[str, tuple[float, bool]]:
    return {
        r["item_id"]: (r["pass_rate"], r["kept"]) for r in read_records(out / "pass_rates.jsonl")
    }


def test_keeps_problems_at_or_above_the_threshold(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    out = tmp_path / "run"
    result = build_filter(config(data, out))

    assert rates(out) == {
        "p0": (1.0, True),
        "p1": (0.5, True),
        "p2": (0.25, False),
        "p3": (0.0, False),
    }
    rows = read_records(out / "rows.jsonl")
    assert rows == [
        {
            "id": "p0",
            "problem": "What is one?",
            "answer": "1",
            "solution": "It is 1.",
            "pass_rate": 1.0,
        },
        {
            "id": "p1",
            "problem": "What is two?",
            "answer": "2",
            "solution": "It is 2.",
            "pass_rate": 0.5,
        },
    ]
    assert len(read_records(out / "samples.jsonl")) == 4 * K
    # One batched generate for the chunk: its K samples differ only in their seeds.
    assert teacher.calls == 1
    assert result.new_samples == 4 * K and result.stats["failed_samples"] == 0
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["problems"], stats["kept"], stats["dropped"]) == (4, 2, 2)
    assert stats["pass_rate_histogram"] == {"0/4": 1, "1/4": 1, "2/4": 1, "3/4": 0, "4/4": 1}
    assert (out / "stats.png").stat().st_size > 0
    # The kept rows load again as training data, solutions included.
    again = load_benchmark(str(out / "rows.jsonl"))
    assert [(i.id, i.solution) for i in again.items] == [("p0", "It is 1."), ("p1", "It is 2.")]
    import datasets

    assert datasets.load_from_disk(str(out / "dataset"))["id"] == ["p0", "p1"]


def test_a_new_threshold_refilters_without_asking_the_teacher(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    out = tmp_path / "run"
    build_filter(config(data, out))
    calls = teacher.calls

    result = build_filter(config(data, out, threshold=0.25))

    assert teacher.calls == calls and result.new_samples == 0
    assert [r["id"] for r in read_records(out / "rows.jsonl")] == ["p0", "p1", "p2"]
    result = build_filter(config(data, out, threshold=1.0))
    assert [r["id"] for r in read_records(out / "rows.jsonl")] == ["p0"]
    assert result.stats["threshold"] == 1.0 and result.stats["kept"] == 1


def test_failed_calls_are_counted_not_written_and_retried_by_a_rerun(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    out = tmp_path / "run"
    one_per_chunk = EngineConfig(batch_size=1, continuous_batching=False)
    teacher.fail_problems = frozenset({"What is two?"})  # fails the chunk that holds it

    result = build_filter(config(data, out, engine=one_per_chunk))

    assert result.stats["failed_samples"] == K and result.new_samples == 3 * K
    assert result.stats["failure_reasons"] == {"ValueError: teacher down": K}
    assert result.stats["incomplete"] == 1 and rates(out)["p1"] == (0.0, False)
    assert "p1" not in {r["item_id"] for r in read_records(out / "samples.jsonl")}

    teacher.fail_problems = frozenset()
    result = build_filter(config(data, out, engine=one_per_chunk))

    assert result.stats["failed_samples"] == 0 and result.new_samples == K
    assert rates(out) == {
        "p0": (1.0, True),
        "p1": (0.5, True),
        "p2": (0.25, False),
        "p3": (0.0, False),
    }


def test_a_run_whose_every_call_fails_is_one_error_and_leaves_no_folder(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    out = tmp_path / "run"
    teacher.fail_samples = frozenset({1})  # fails the one batch that holds every call

    with pytest.raises(UserError, match="every teacher call failed .16., the first with: Val"):
        build_filter(config(data, out))

    assert not out.exists()
    teacher.fail_samples = frozenset()
    assert build_filter(config(data, out)).new_samples == 4 * K


def test_a_killed_run_resumes_to_the_same_result(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    whole = tmp_path / "whole"
    build_filter(config(data, whole))
    killed = tmp_path / "killed"
    build_filter(config(data, killed))
    samples = killed / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    samples.write_text("".join(lines[:5]) + lines[5][:20])  # killed mid-line

    result = build_filter(config(data, killed))

    assert result.new_samples == 4 * K - 5
    assert read_records(killed / "rows.jsonl") == read_records(whole / "rows.jsonl")
    assert read_records(killed / "pass_rates.jsonl") == read_records(whole / "pass_rates.jsonl")
    assert len(read_records(samples)) == 4 * K


def test_the_reference_stand_in_solves_every_problem(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = build_filter(
        FilterConfig(
            teacher="reference",
            data="arith",
            limit=5,
            k=2,
            out=str(out),
            sampling=SamplingConfig(max_tokens=64),
        )
    )

    assert {r["pass_rate"] for r in read_records(out / "pass_rates.jsonl")} == {1.0}
    assert result.stats["kept"] == 5
    assert "stand-in" in result.stats["stand_in"]


def test_decontaminate_alone_drops_planted_duplicates_per_benchmark(tmp_path: Path) -> None:
    arith = load_benchmark("arith").items[3]
    gsm = load_benchmark("gsm8k").items[0]
    thirteen = " ".join(words(gsm.problem)[:NGRAM])
    rows = [
        {"id": "copy", "problem": arith.problem, "answer": arith.answer},
        {"id": "embedded", "problem": f"Zoe read: {thirteen}. How many zebras?", "answer": "2"},
        {"id": "clean", "problem": "A train goes 60 miles per hour for 3 hours.", "answer": "180"},
    ]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"

    result = build_filter(
        FilterConfig(data=str(data), out=str(out), decontaminate=True), progress=None
    )

    assert read_records(out / "rows.jsonl") == [rows[2]]
    assert [
        (d["id"], d["benchmark"], d["how"], d["eval_id"])
        for d in read_records(out / "dropped.jsonl")
    ] == [
        ("copy", "arith", "exact", arith.id),
        ("embedded", "gsm8k", "ngram", gsm.id),
    ]
    counts = result.stats["decontamination"]["per_benchmark"]
    assert counts["arith"] == {"exact": 1, "ngram": 0}
    assert counts["gsm8k"] == {"exact": 0, "ngram": 1}
    assert (result.stats["problems"], result.stats["kept"], result.stats["dropped"]) == (3, 1, 2)
    assert "pass_rate" not in result.stats and not (out / "samples.jsonl").exists()


def test_decontamination_runs_before_the_teacher(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    arith = load_benchmark("arith").items[0]
    with data.open("a") as f:  # the scripted teacher would fail on it: it is not in PLAN
        f.write(json.dumps({"id": "leak", "problem": arith.problem, "answer": arith.answer}))
    out = tmp_path / "run"

    result = build_filter(config(data, out, decontaminate=True))

    assert result.stats["failed_samples"] == 0
    assert "leak" not in rates(out)
    assert len(read_records(out / "samples.jsonl")) == 4 * K
    assert result.stats["decontamination"]["dropped"] == 1
    assert (result.stats["problems"], result.stats["kept"]) == (5, 2)


def test_a_band_keeps_exactly_the_pass_rates_within_it(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    out = tmp_path / "run"
    result = build_filter(config(data, out, threshold=0.25, max_threshold=0.5))

    # Both bounds are kept (0.25 and 0.5), 1 is above the band and 0 below it.
    assert rates(out) == {
        "p0": (1.0, False),
        "p1": (0.5, True),
        "p2": (0.25, True),
        "p3": (0.0, False),
    }
    assert [r["id"] for r in read_records(out / "rows.jsonl")] == ["p1", "p2"]
    stats = result.stats
    assert (stats["kept"], stats["below_threshold"], stats["above_max_threshold"]) == (2, 1, 1)
    assert stats["max_threshold"] == 0.5
    calls = teacher.calls

    # Another band re-filters the saved samples: the teacher is not asked again.
    again = build_filter(config(data, out, threshold=0.25, max_threshold=0.25))

    assert teacher.calls == calls and again.new_samples == 0
    assert [r["id"] for r in read_records(out / "rows.jsonl")] == ["p2"]
    assert again.stats["above_max_threshold"] == 2


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"k": 0}, "k"),
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": 0.6, "max_threshold": 0.2}, "max_threshold"),
        ({"max_threshold": 1.5}, "max_threshold"),
        ({"timeout": 0}, "timeout"),
        ({"sampling": SamplingConfig(n=2)}, "sampling.n"),
        ({"teacher": None}, "nothing to do"),
    ],
)
def test_check_refuses_bad_values(data: Path, tmp_path: Path, changes: dict, key: str) -> None:
    with pytest.raises(UserError, match=key):
        config(data, tmp_path / "run", **changes).check()


def test_an_unreachable_teacher_url_fails_before_any_work(data: Path, tmp_path: Path) -> None:
    from tests.servers import free_port

    out = tmp_path / "run"
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(UserError, match="cannot reach"):
        build_filter(config(data, out, teacher=url))
    assert not out.exists()


def test_another_teacher_in_the_same_folder_is_refused(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    out = tmp_path / "run"
    build_filter(config(data, out))
    with pytest.raises(UserError, match="different teacher"):
        build_filter(config(data, out, teacher="reference"))


@pytest.mark.slow
def test_the_real_smollm2_teacher_on_arith(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = build_filter(
        FilterConfig(
            teacher="smollm2-135m",
            data="arith",
            limit=20,
            k=2,
            out=str(out),
            sampling=SamplingConfig(max_tokens=32, temperature=1.0),
        )
    )

    assert result.new_samples == 40 and result.stats["failed_samples"] == 0
    passes = read_records(out / "pass_rates.jsonl")
    assert len(passes) == 20 and all(r["k"] == 2 for r in passes)
    assert result.stats["kept"] == sum(r["pass_rate"] >= 0.5 for r in passes)


def test_a_problem_over_the_size_bound_is_neither_asked_nor_kept(
    data: Path, tmp_path: Path, teacher: ScriptedTeacher
) -> None:
    huge = {"id": "huge", "problem": "1 + " * (MAX_PROBLEM_CHARS // 4) + "1", "answer": "1"}
    with data.open("a") as lines:
        lines.write(json.dumps(huge) + "\n")

    result = build_filter(config(data, tmp_path / "run"))  # the teacher knows no such problem

    assert result.stats["oversized"] == 1 and result.stats["failed_samples"] == 0
    assert (result.stats["problems"], result.new_samples) == (5, 4 * K)
    assert "huge" not in rates(tmp_path / "run")
