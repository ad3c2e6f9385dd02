"""Tests for `run_eval`: real generation with the tiny model, run folders and resumption."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from collabrl import runs
from collabrl.config import build_config
from collabrl.data.benchmarks import Benchmark, load_benchmark
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.runner import metrics_of, prepare_run_folder, read_problems, run_eval


def disk_metrics(out_dir: Path, bench: Benchmark, n: int) -> dict:
    """The metrics of the samples on disk, as the runner computes them at the end of a run."""
    return metrics_of(*read_problems(out_dir, bench, n), out_dir)


def _config(model: Path, out: Path, **overrides) -> EvalConfig:
    layer = {
        "benchmark": "gsm8k",
        "model": str(model),
        "limit": 2,
        "out": str(out),
        "sampling": {"n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 3},
        "engine": {"batch_size": 4},
    }
    sets = [f"{key}={value}" for key, value in overrides.items()]
    return build_config(EvalConfig, [layer], sets)


def _samples(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / runs.SAMPLES).read_text().splitlines()]


def _keys(samples: list[dict]) -> list[tuple[str, int]]:
    return [(s["item_id"], s["sample"]) for s in samples]


# --- a fresh run ---------------------------------------------------------------------------------


def test_run_writes_config_samples_and_metrics(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    config = _config(tiny_model_dir, out, **{"sampling.n": 3})
    progress: list[tuple[int, int]] = []
    result = run_eval(config, engine=tiny_engine, progress=lambda d, t: progress.append((d, t)))

    assert result.out_dir == out
    assert result.new_samples == 6
    assert progress[-1] == (6, 6)
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)

    saved = yaml.safe_load((out / runs.CONFIG).read_text())
    assert saved["model"] == str(tiny_model_dir)
    assert saved["sampling"]["n"] == 3

    samples = _samples(out)
    assert len(samples) == 2 * 3
    items = load_benchmark("gsm8k", limit=2).items
    assert sorted(_keys(samples)) == sorted((i.id, s) for i in items for s in range(3))
    gold = {i.id: i.answer for i in items}
    for s in samples:
        assert s["gold"] == gold[s["item_id"]]
        assert s["prompt"][0]["role"] == "system" and "\\boxed{}" in s["prompt"][0]["content"]
        assert 1 <= s["completion_tokens"] <= 6
        assert s["prompt_tokens"] > 0
        # A 6-token budget: the tiny model's answers are cut, or end at its EOS.
        assert (s["end"], s["finish_reason"]) in (("length", "length"), ("eos", "stop"))
        assert s["episode"]["end"] == s["end"]
        assert isinstance(s["correct"], bool)
        assert 0.0 <= s["f1"] <= 1.0

    metrics = json.loads((out / runs.METRICS).read_text())
    assert metrics == result.metrics
    for key in (
        "pass@1",
        "pass@2",
        "pass@3",
        "avg@3",
        "maj@3",
        "f1@3",
        "var",
        "var_f1",
        "stderr",
        "call_ratio",
    ):
        assert key in metrics, key
    assert "pass@4" not in metrics
    assert metrics["problems"] == 2
    assert metrics["samples_per_problem"] == 3
    assert metrics["avg@3"] == pytest.approx(sum(s["correct"] for s in samples) / 6)
    assert metrics["completion_tokens"] == sum(s["completion_tokens"] for s in samples)
    assert metrics["call_ratio"] == 0.0


def test_run_with_a_model_reference_loads_its_own_engine(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "by-ref"
    config = _config(tiny_model_dir, out, limit=1, **{"sampling.temperature": 0})
    result = run_eval(config)
    samples = _samples(out)
    assert result.new_samples == 2 and len(samples) == 2
    # Greedy: both samples of the problem are the same completion.
    assert samples[0]["completion"] == samples[1]["completion"]


def test_same_seed_gives_the_same_samples(tiny_model_dir, tiny_engine, tmp_path) -> None:
    run_eval(_config(tiny_model_dir, tmp_path / "a"), engine=tiny_engine)
    run_eval(_config(tiny_model_dir, tmp_path / "b"), engine=tiny_engine)
    run_eval(_config(tiny_model_dir, tmp_path / "c", **{"sampling.seed": 4}), engine=tiny_engine)
    a, b, c = (_samples(tmp_path / name) for name in "abc")
    assert [s["completion"] for s in a] == [s["completion"] for s in b]
    assert [s["completion"] for s in a] != [s["completion"] for s in c]


def test_user_jsonl_benchmark_with_custom_fields(tiny_model_dir, tiny_engine, tmp_path) -> None:
    data = tmp_path / "mine.jsonl"
    data.write_text(
        json.dumps({"key": "k1", "q": "1 + {1}?", "a": "2"})
        + "\n"
        + json.dumps({"key": "k2", "q": "2 + 2?", "a": "4"})
        + "\n"
    )
    out = tmp_path / "mine-run"
    config = _config(
        tiny_model_dir,
        out,
        benchmark=str(data),
        problem_field="q",
        answer_field="a",
        id_field="key",
        prompt="plain",
        limit="",
    )
    run_eval(config, engine=tiny_engine)
    samples = _samples(out)
    assert {s["item_id"] for s in samples} == {"k1", "k2"}
    assert {s["prompt"][0]["content"] for s in samples} == {"1 + {1}?", "2 + 2?"}
    assert all(len(s["prompt"]) == 1 for s in samples)  # plain: no system message


# --- resumption ----------------------------------------------------------------------------------


def test_resume_generates_only_the_missing_item(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    run_eval(_config(tiny_model_dir, out, limit=2), engine=tiny_engine)
    before = (out / runs.SAMPLES).read_bytes()

    result = run_eval(_config(tiny_model_dir, out, limit=3), engine=tiny_engine)
    assert result.new_samples == 2
    after = (out / runs.SAMPLES).read_bytes()
    assert after.startswith(before)  # finished samples are kept, not rewritten
    keys = _keys(_samples(out))
    assert len(keys) == 6 and len(set(keys)) == 6
    third = load_benchmark("gsm8k", limit=3).items[2].id
    assert Counter(k for k, _ in keys)[third] == 2
    assert result.metrics["problems"] == 3
    assert yaml.safe_load((out / runs.CONFIG).read_text())["limit"] == 3

    again = run_eval(_config(tiny_model_dir, out, limit=3), engine=tiny_engine)
    assert again.new_samples == 0
    assert (out / runs.SAMPLES).read_bytes() == after
    assert again.metrics == result.metrics


def test_a_run_cut_short_and_resumed_samples_what_an_uninterrupted_one_does(
    tiny_model_dir, tiny_engine, tmp_path
) -> None:
    """Chunks are seeded by their place among all units, not among the ones left: the
    resumed run redraws the cut chunk whole and keeps only what is missing."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    # Chunks of 2 (static batches): the cut falls inside the second of three.
    overrides = {"limit": 3, "engine.batch_size": 2, "engine.continuous_batching": False}
    run_eval(_config(tiny_model_dir, whole, **overrides), engine=tiny_engine)
    run_eval(_config(tiny_model_dir, cut, **overrides), engine=tiny_engine)
    lines = (cut / runs.SAMPLES).read_text().splitlines(keepends=True)
    (cut / runs.SAMPLES).write_text("".join(lines[:3]))  # killed after 3 of 6 samples

    result = run_eval(_config(tiny_model_dir, cut, **overrides), engine=tiny_engine)
    assert result.new_samples == 3

    def completions(out: Path) -> dict:
        return {(s["item_id"], s["sample"]): s["completion"] for s in _samples(out)}

    assert completions(cut) == completions(whole)


def test_more_samples_per_problem_is_a_different_experiment(
    tiny_model_dir, tiny_engine, tmp_path
) -> None:
    out = tmp_path / "run"
    run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    with pytest.raises(UserError, match="different sampling"):
        run_eval(_config(tiny_model_dir, out, **{"sampling.n": 4}), engine=tiny_engine)


def test_torn_last_line_is_dropped_and_regenerated(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    lines = (out / runs.SAMPLES).read_text().splitlines(keepends=True)
    # Simulate `kill -9` in the middle of writing the last sample.
    (out / runs.SAMPLES).write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    lost = _keys([json.loads(lines[-1])])[0]

    result = run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    assert result.new_samples == 1
    samples = _samples(out)  # every line parses: the torn one is gone
    keys = _keys(samples)
    assert len(keys) == 4 and len(set(keys)) == 4 and keys[-1] == lost
    assert (out / runs.SAMPLES).read_text().endswith("\n")
    assert result.metrics["samples_per_problem"] == 2


def test_changed_temperature_is_refused(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    before = (out / runs.SAMPLES).read_bytes()
    with pytest.raises(UserError) as info:
        run_eval(_config(tiny_model_dir, out, **{"sampling.temperature": 0.5}), engine=tiny_engine)
    assert "different sampling" in info.value.problem
    assert str(out) in info.value.problem
    assert "--out" in info.value.fix
    assert (out / runs.SAMPLES).read_bytes() == before
    assert yaml.safe_load((out / runs.CONFIG).read_text())["sampling"]["temperature"] == 1.0


def test_changed_prompt_is_refused(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    with pytest.raises(UserError, match="different prompt"):
        run_eval(_config(tiny_model_dir, out, prompt="plain"), engine=tiny_engine)


def test_resources_may_change_on_resume(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    result = run_eval(
        _config(tiny_model_dir, out, **{"engine.batch_size": 1, "engine.device": "cpu"}),
        engine=tiny_engine,
    )
    assert result.new_samples == 0
    assert yaml.safe_load((out / runs.CONFIG).read_text())["engine"]["batch_size"] == 1


def test_a_run_that_failed_before_sampling_can_be_corrected(
    tiny_model_dir, tiny_engine, tmp_path
) -> None:
    out = tmp_path / "run"
    with pytest.raises(UserError, match="unknown model"):
        run_eval(_config(tmp_path / "typo-model", out))
    result = run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    assert result.new_samples == 4
    assert yaml.safe_load((out / runs.CONFIG).read_text())["model"] == str(tiny_model_dir)


def test_prepare_run_folder_defaults_under_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = build_config(EvalConfig, [{"model": "/some/where/My Model/", "benchmark": "aime24"}])
    out = prepare_run_folder(config)
    assert out.parent == Path("runs")
    assert out.name.startswith("eval-aime24-My_Model-")
    assert (tmp_path / out / runs.CONFIG).is_file()


# --- metrics of hand-written samples on disk -----------------------------------------------------


def _record(item: str, sample: int, answer: str | None, correct: bool, **extra) -> dict:
    return {
        "item_id": item,
        "sample": sample,
        "answer": answer,
        "correct": correct,
        "f1": 1.0 if correct else 0.0,
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "finish_reason": "stop",
        "seconds": 0.5,
        **extra,
    }


def test_metrics_from_samples_on_disk(tmp_path) -> None:
    items = load_benchmark("gsm8k", limit=2).items
    first, second = items
    rows = [
        _record(first.id, 0, first.answer, True, helper_tokens=5),
        _record(first.id, 1, "0", False),
        _record(first.id, 2, first.answer, True),
        _record(second.id, 0, "1", False, finish_reason="length"),
        _record(second.id, 1, "1", False),
        _record(second.id, 2, second.answer, True),
        _record(second.id, 3, second.answer, True),  # beyond n: ignored
    ]
    (tmp_path / runs.SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = load_benchmark("gsm8k", limit=2)
    metrics = disk_metrics(tmp_path, bench, n=3)

    assert metrics["samples_per_problem"] == 3
    assert metrics["avg@3"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert metrics["maj@3"] == pytest.approx(0.5)  # first: gold wins 2-1; second: "1" wins 2-1
    assert metrics["pass@3"] == 1.0
    assert metrics["completion_tokens"] == 6 * 20
    assert metrics["call_ratio"] == pytest.approx(5 / 120)
    assert metrics["truncated"] == pytest.approx(1 / 6)
    assert metrics["generation_seconds"] == 3.0


def test_metrics_without_samples_is_a_user_error(tmp_path) -> None:
    with pytest.raises(UserError, match="no finished samples"):
        disk_metrics(tmp_path, load_benchmark("gsm8k", limit=1), n=1)


# --- records -------------------------------------------------------------------------------------


def test_read_records_of_a_missing_file_is_empty(tmp_path) -> None:
    assert runs.read_records(tmp_path / "none.jsonl") == []


def test_read_records_of_an_empty_file_is_empty(tmp_path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert runs.read_records(path) == []
    assert path.read_text() == ""


def test_read_records_skips_blank_lines_and_keeps_unicode(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"a": "π ≈ 3.14 — 答"}\n')
    assert runs.read_records(path) == [{"a": 1}, {"a": "π ≈ 3.14 — 答"}]


def test_read_records_keeps_a_completion_with_a_line_separator_whole(tmp_path) -> None:
    # RecordWriter writes U+2028 unescaped (ensure_ascii=False); it is not a line end.
    path = tmp_path / "r.jsonl"
    with runs.RecordWriter(path) as writer:
        writer.write({"completion": "one\u2028two\u2029three\x85four"})
        writer.write({"a": 2})
    assert runs.read_records(path) == [
        {"completion": "one\u2028two\u2029three\x85four"},
        {"a": 2},
    ]


def test_read_records_skips_a_torn_last_line_and_leaves_the_file(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    torn = b'{"a": 1}\n{"a": 2}\n{"a": "\xcf'  # cut inside a UTF-8 character
    path.write_bytes(torn)
    assert runs.read_records(path) == [{"a": 1}, {"a": 2}]
    assert path.read_bytes() == torn  # a reader never writes: the run may still be live


def test_a_resuming_writer_drops_a_file_of_only_a_torn_line(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"item_id": "x", "sam')
    assert runs.read_records(path) == []
    with runs.RecordWriter(path) as writer:
        writer.write({"a": 1})
    assert path.read_text() == '{"a": 1}\n'


def test_read_records_reports_a_corrupt_middle_line(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(UserError, match=r"r\.jsonl:2 is not valid JSON"):
        runs.read_records(path)


def test_record_writer_appends_whole_lines(tmp_path) -> None:
    path = tmp_path / "w.jsonl"
    with runs.RecordWriter(path) as writer:
        writer.write({"a": 1})
        assert path.read_text() == '{"a": 1}\n'  # flushed before returning
    with runs.RecordWriter(path) as writer:
        writer.write({"b": "ü"})
    assert runs.read_records(path) == [{"a": 1}, {"b": "ü"}]


def test_write_json_replaces_atomically(tmp_path) -> None:
    path = tmp_path / "metrics.json"
    runs.write_json(path, {"x": 1})
    runs.write_json(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


# --- the LLM judge, over a real server -----------------------------------------------------------


def test_judge_verdicts_are_logged_apart(tiny_model_dir, tiny_engine, tmp_path) -> None:
    from tests.servers import ServerProcess

    out = tmp_path / "judged"
    run_eval(_config(tiny_model_dir, out, limit=1, **{"sampling.n": 1}), engine=tiny_engine)
    # Make the one sample a rule-rejected answer, as a wrong extraction would be.
    [sample] = _samples(out)
    sample.update(answer="eighteen", correct=False)
    (out / runs.SAMPLES).write_text(json.dumps(sample) + "\n")

    with ServerProcess(tiny_model_dir, role="judge") as judge:
        config = _config(
            tiny_model_dir, out, limit=1, judge=judge.url, judge_model="judge", **{"sampling.n": 1}
        )
        result = run_eval(config, engine=tiny_engine)

    assert result.new_samples == 0
    [verdict] = [json.loads(line) for line in (out / "judge.jsonl").read_text().splitlines()]
    assert verdict["answer"] == "eighteen" and isinstance(verdict["judge_correct"], bool)
    block = result.metrics["judge"]
    assert block["judged"] == 1 and block["accuracy_rules_only"] == 0.0
    assert block["accuracy_with_judge"] == float(verdict["judge_correct"])
    assert result.metrics["avg@1"] == 0.0  # the headline metric stays rule-based
    assert not _samples(out)[0]["correct"]


def test_eval_over_http_against_the_embedded_server(tiny_model_dir, tmp_path) -> None:
    from tests.servers import ServerProcess

    out = tmp_path / "http"
    with ServerProcess(tiny_model_dir, role="policy") as server:
        result = run_eval(_config(server.url, out, **{"sampling.n": 2}))
    samples = _samples(out)
    assert result.new_samples == 4 and len(samples) == 4
    assert all(s["completion_tokens"] >= 1 for s in samples)  # from the server's usage
    saved = yaml.safe_load((out / runs.CONFIG).read_text())
    assert saved["model"] == server.url
    assert "avg@2" in result.metrics
