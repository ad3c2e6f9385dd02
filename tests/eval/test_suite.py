"""Several benchmarks in one evaluation (`collab eval aime24,math500`): names, checks before
anything is written, one folder per benchmark, one engine load, resumption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from collabrl import runs
from collabrl.config import build_config
from collabrl.errors import UserError
from collabrl.eval import suite
from collabrl.eval.config import EvalConfig
from collabrl.eval.runner import run_eval
from collabrl.eval.suite import benchmark_names, plan_suite, run_suite


def _config(model: Path, out: Path | None, **sets: object) -> EvalConfig:
    layer = {
        "benchmark": "aime24,math500",
        "model": str(model),
        "limit": 2,
        "out": str(out) if out else None,
        "sampling": {"n": 2, "max_tokens": 4, "temperature": 1.0, "seed": 5},
    }
    return build_config(EvalConfig, [layer], [f"{k}={v}" for k, v in sets.items()])


def _completions(folder: Path) -> dict[tuple[str, int], str]:
    records = runs.read_records(folder / runs.SAMPLES)
    return {(r["item_id"], r["sample"]): r["completion"] for r in records}


# --- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("aime24", ["aime24"]),
        ("aime24,math500", ["aime24", "math500"]),
        (" aime24 , math500,gsm8k", ["aime24", "math500", "gsm8k"]),
    ],
)
def test_benchmark_names(text: str, names: list[str]) -> None:
    assert benchmark_names(text) == names


def test_a_path_with_a_comma_is_one_benchmark(tmp_path: Path) -> None:
    path = tmp_path / "a,b.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n')
    assert benchmark_names(str(path)) == [str(path)]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no benchmark given"),
        (" , ", "no benchmark given"),
        ("aime24,,math500", "an empty benchmark name in 'aime24,,math500'"),
        ("aime24,", "an empty benchmark name"),
        ("aime24,math500,aime24", "benchmark 'aime24' is named twice"),
    ],
)
def test_bad_lists_are_refused(text: str, problem: str) -> None:
    with pytest.raises(UserError) as info:
        benchmark_names(text)
    assert problem in info.value.problem


# --- checks before anything is written -----------------------------------------------------------


@pytest.mark.parametrize("names", [["aime24", "gsm9k"], ["gsm9k", "aime24"]])
def test_an_unknown_name_anywhere_is_refused_first(tiny_model_dir, tmp_path, names) -> None:
    out = tmp_path / "out"
    with pytest.raises(UserError, match="unknown benchmark 'gsm9k'"):
        run_suite(_config(tiny_model_dir, out), names)
    assert not out.exists()


def test_each_benchmark_plans_its_own_folder(tiny_model_dir, tmp_path: Path) -> None:
    plans = plan_suite(_config(tiny_model_dir, tmp_path / "out"), ["aime24", "math500"])
    assert [p.config.benchmark for p in plans] == ["aime24", "math500"]
    assert [p.config.out for p in plans] == [
        str(tmp_path / "out" / b) for b in ("aime24", "math500")
    ]
    assert [len(p.bench.items) for p in plans] == [2, 2]
    defaults = plan_suite(_config(tiny_model_dir, None), ["aime24", "math500"])
    assert [p.config.out for p in defaults] == [None, None]  # each its own runs/ folder


def test_two_benchmarks_sharing_a_folder_name_are_refused(tiny_model_dir, tmp_path) -> None:
    data = tmp_path / "aime24.jsonl"
    data.write_text('{"problem": "1+1?", "answer": "2"}\n')
    with pytest.raises(UserError, match="share the run folder name 'aime24'"):
        plan_suite(_config(tiny_model_dir, tmp_path / "out"), ["aime24", str(data)])


def test_a_folder_of_another_experiment_is_refused_before_sampling(
    tiny_model_dir, tiny_engine, tmp_path, monkeypatch
) -> None:
    out = tmp_path / "out"
    other = _config(tiny_model_dir, out / "math500", benchmark="math500", **{"sampling.seed": 9})
    run_eval(other, engine=tiny_engine)
    monkeypatch.setattr(suite, "create_engine", _refuse)
    with pytest.raises(UserError, match="holds a run with a different sampling"):
        run_suite(_config(tiny_model_dir, out), ["aime24", "math500"])
    assert not (out / "aime24" / runs.SAMPLES).exists()


def _refuse(*args: object) -> None:
    raise AssertionError("no model may load")


# --- runs ----------------------------------------------------------------------------------------


def test_suite_runs_each_benchmark_into_its_folder_on_one_engine(
    tiny_model_dir, tmp_path, monkeypatch
) -> None:
    loads: list[str] = []

    def counting(model: str, engine_config):
        loads.append(model)
        return create_engine(model, engine_config)

    create_engine = suite.create_engine
    monkeypatch.setattr(suite, "create_engine", counting)
    out = tmp_path / "out"
    results = run_suite(_config(tiny_model_dir, out), ["aime24", "math500"])

    assert loads == [str(tiny_model_dir)]
    assert list(results) == ["aime24", "math500"]
    for name, result in results.items():
        assert result.out_dir == out / name and result.new_samples == 4
        saved = yaml.safe_load((out / name / runs.CONFIG).read_text())
        assert (saved["benchmark"], saved["out"]) == (name, str(out / name))
        assert json.loads((out / name / runs.METRICS).read_text()) == result.metrics
        assert result.metrics["problems"] == 2 and result.metrics["samples_per_problem"] == 2

    # Resumed: nothing is missing, so no model loads; a larger --limit samples only the new.
    monkeypatch.setattr(suite, "create_engine", _refuse)
    again = run_suite(_config(tiny_model_dir, out), ["aime24", "math500"])
    assert [r.new_samples for r in again.values()] == [0, 0]
    monkeypatch.setattr(suite, "create_engine", counting)
    more = run_suite(_config(tiny_model_dir, out, limit=3), ["aime24", "math500"])
    assert [r.new_samples for r in more.values()] == [2, 2]


def test_a_suite_samples_what_single_runs_do(tiny_model_dir, tiny_engine, tmp_path) -> None:
    """The shared engine changes nothing: each folder holds the samples that a run of
    that benchmark alone writes."""
    run_suite(_config(tiny_model_dir, tmp_path / "suite"), ["aime24", "math500"])
    for name in ("aime24", "math500"):
        alone = tmp_path / "alone" / name
        run_eval(_config(tiny_model_dir, alone, benchmark=name), engine=tiny_engine)
        assert _completions(tmp_path / "suite" / name) == _completions(alone)


def test_progress_opens_once_per_benchmark(tiny_model_dir, tmp_path) -> None:
    from contextlib import contextmanager

    seen: list[tuple[str, list[tuple[int, int]]]] = []

    @contextmanager
    def bar(config: EvalConfig):
        calls: list[tuple[int, int]] = []
        seen.append((config.benchmark, calls))
        yield lambda done, total: calls.append((done, total))

    run_suite(_config(tiny_model_dir, tmp_path / "out"), ["aime24", "math500"], bar)
    assert [name for name, _ in seen] == ["aime24", "math500"]
    assert all(calls[-1] == (4, 4) for _, calls in seen)
