"""results.json, lm-eval's kind of results file: what a run and a suite write, the standard
errors on hand-written samples, `collab eval report` reading it back; and the warning of
greedy decoding with several samples per problem."""

from __future__ import annotations

import json
import math
import statistics
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from collabrl import runs
from collabrl.cli.main import app
from collabrl.config import build_config
from collabrl.data.benchmarks import load_benchmark
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.report import load_run, report_rows, run_folders
from collabrl.eval.results import RESULTS
from collabrl.eval.runner import run_eval
from collabrl.eval.suite import run_suite
from collabrl.redact import REDACTED
from tests.eval.test_runner import _record


def _config(model: Path, out: Path, benchmark: str = "gsm8k", **sets: object) -> EvalConfig:
    layer = {
        "benchmark": benchmark,
        "model": str(model),
        "limit": 2,
        "out": str(out),
        "sampling": {"n": 2, "max_tokens": 4, "temperature": 1.0, "seed": 3},
    }
    return build_config(EvalConfig, [layer], [f"{k}={v}" for k, v in sets.items()])


def _results(folder: Path) -> dict:
    return json.loads((folder / RESULTS).read_text())


def test_a_run_writes_results_json_beside_its_samples(tiny_model_dir, tiny_engine, tmp_path):
    out = tmp_path / "run"
    result = run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    doc = _results(out)

    assert {
        *("results", "higher_is_better", "n-samples", "configs", "config", "versions"),
        *("date", "git_hash", "samples", "model", "protocol", "format", "n-shot"),
        *("task_hashes", "chat_template", "chat_template_sha", "total_evaluation_time_seconds"),
    } <= set(doc)
    entry = doc["results"]["gsm8k"]
    # metrics.json stays beside it: the same metrics, without the standard errors and
    # lm-eval's copies of them (`exact_match,none`, its alias).
    ours = {k: v for k, v in entry.items() if "," not in k and k != "alias"}
    assert {k: v for k, v in ours.items() if not k.endswith("_stderr")} == result.metrics
    assert list(entry)[:4] == ["pass@1", "pass@1_stderr", "pass@2", "pass@2_stderr"]
    # pass@1's standard error: the sample deviation of the problems' shares right, / sqrt(2).
    samples = runs.samples_by_item(out, 2)
    shares = [sum(s["correct"] for s in found) / 2 for found in samples.values()]
    assert entry["pass@1_stderr"] == pytest.approx(statistics.stdev(shares) / math.sqrt(2))
    assert doc["higher_is_better"]["gsm8k"] == dict.fromkeys(
        ("pass@1", "pass@2", "avg@2", "maj@2", "strict-match", "flexible-extract", "f1@2"), True
    ) | {"exact_match": True, "f1": True}
    assert doc["n-samples"]["gsm8k"] == {"effective": 2, "scored": 2}
    configs = doc["configs"]["gsm8k"]
    assert (configs["n"], configs["k"], configs["limit"]) == (2, [1, 2], 2)
    assert configs["sampling"]["temperature"] == 1.0
    assert (out / doc["samples"]["gsm8k"]) == out / runs.SAMPLES
    # The resolved config, as config.yaml holds it (a --config file).
    assert doc["config"] == yaml.safe_load((out / runs.CONFIG).read_text())
    assert (doc["model"], doc["protocol"]) == (str(tiny_model_dir), "solo")
    assert {"collabrl", "torch", "transformers", "trl"} <= set(doc["versions"])
    assert "not installed" not in doc["versions"].values()
    assert datetime.fromisoformat(doc["date"]).tzinfo is not None


def test_an_api_key_is_not_written_into_results(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    run_eval(_config(tiny_model_dir, out, **{"engine.api_key": "sk-secret"}), engine=tiny_engine)
    assert "sk-secret" not in (out / RESULTS).read_text()
    assert _results(out)["config"]["engine"]["api_key"] == REDACTED


def test_a_password_in_the_model_url_is_not_written_into_results(tmp_path) -> None:
    """`collab eval --model http://user:password@host/v1` as a user runs it, its samples
    already on disk (nothing is sampled): results.json, made to be shared, holds neither
    the password, nor the URL's token, nor the --api-key."""
    out = tmp_path / "run"
    out.mkdir()
    item = load_benchmark("gsm8k", limit=1).items[0]
    (out / runs.SAMPLES).write_text(json.dumps(_record(item.id, 0, item.answer, True)) + "\n")
    url = "http://me:hunter2@127.0.0.1:9/v1?api_key=qk"
    args = ["eval", "gsm8k", "--model", url, "--api-key", "sk-LEAK", "--limit", "1"]
    result = CliRunner().invoke(app, [*args, "--n", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output

    text = (out / RESULTS).read_text()
    for secret in ("hunter2", "qk", "sk-LEAK"):
        assert secret not in text
    doc = json.loads(text)
    assert doc["model"] == f"http://me:{REDACTED}@127.0.0.1:9/v1?api_key={REDACTED}"
    assert doc["config"]["model"] == doc["model"]
    assert doc["config"]["engine"]["api_key"] == REDACTED


def test_standard_errors_of_hand_written_samples(tiny_model_dir, tmp_path) -> None:
    """Three problems, 2 samples each, 1, 2 and 0 right: nothing left to sample, so no
    model loads, and results.json holds the standard errors computed by hand."""
    out = tmp_path / "run"
    out.mkdir()
    first, second, third = load_benchmark("gsm8k", limit=3).items
    rows = [
        _record(first.id, 0, first.answer, True),
        _record(first.id, 1, "0", False),
        _record(second.id, 0, second.answer, True),
        _record(second.id, 1, second.answer, True),
        _record(third.id, 0, "0", False),
        _record(third.id, 1, "0", False),
    ]
    (out / runs.SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_eval(_config(tiny_model_dir, out, limit=3))
    assert result.new_samples == 0

    entry = _results(out)["results"]["gsm8k"]
    # pass@1: 1/2, 1, 0 (mean 1/2); squares 1/4 + 1/4; / 2 = 1/4 -> sd 1/2; / sqrt(3)
    assert entry["pass@1"] == 0.5
    assert entry["pass@1_stderr"] == pytest.approx(0.5 / math.sqrt(3))
    assert entry["avg@2_stderr"] == entry["pass@1_stderr"]
    # pass@2: 1, 1, 0 (mean 2/3); squares 1/9 + 1/9 + 4/9; / 2 = 1/3; / 3 = 1/9 -> 1/3
    assert entry["pass@2"] == pytest.approx(2 / 3)
    assert entry["pass@2_stderr"] == pytest.approx(1 / 3)
    # maj@2: the first answer wins a tie: right, right, wrong -> as pass@2
    assert entry["maj@2_stderr"] == pytest.approx(1 / 3)


def test_report_reads_results_json_alone(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    run_eval(_config(tiny_model_dir, out), engine=tiny_engine)
    metrics = json.loads((out / runs.METRICS).read_text())
    # What the report shows comes from results.json: the run's identity included.
    (out / runs.METRICS).unlink()
    (out / runs.CONFIG).unlink()
    run = load_run(out)
    assert (run["model"], run["protocol"], run["benchmark"], run["n"]) == (
        str(tiny_model_dir), "solo", "gsm8k", 2
    )  # fmt: skip
    assert run["metrics"]["pass@1"] == metrics["pass@1"]
    assert "pass@1_stderr" in run["metrics"]
    header, rows = report_rows([run])
    stderr = run["metrics"]["pass@1_stderr"]
    assert rows[0][header.index("pass@1")] == f"{metrics['pass@1']:.4f} ± {stderr:.4f}"


def test_a_suite_writes_one_results_json_the_report_expands(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "suite"
    run_suite(_config(tiny_model_dir, out, "aime24,math500"), ["aime24", "math500"])
    doc = _results(out)

    assert list(doc["results"]) == ["aime24", "math500"]
    assert doc["samples"] == {"aime24": "aime24/samples.jsonl", "math500": "math500/samples.jsonl"}
    assert doc["config"]["benchmark"] == "aime24,math500"
    for name in ("aime24", "math500"):
        assert doc["results"][name] == _results(out / name)["results"][name]
        assert doc["configs"][name]["benchmark"] == name
    # `collab eval report DIR`: a row per benchmark, each read from its own folder.
    assert run_folders([out]) == [out / "aime24", out / "math500"]
    _, rows = report_rows([load_run(folder) for folder in run_folders([out])])
    assert [row[3] for row in rows] == ["aime24", "math500"]
    with pytest.raises(UserError, match="holds 2 benchmarks"):
        load_run(out)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('{"results": 1}', "not written by `collab eval`"),
        ('{"results": {}, "format": 99}', "results format 99"),
        ("[", "not valid JSON"),
    ],
)
def test_a_results_json_not_written_by_eval_is_refused(tmp_path, body, problem) -> None:
    (tmp_path / RESULTS).write_text(body)
    with pytest.raises(UserError, match=problem):
        load_run(tmp_path)


# --- greedy decoding with several samples ---------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "warned"),
    [
        ({"sampling.n": 4}, "sampling.temperature 0"),  # the default temperature
        ({"sampling.n": 4, "sampling.temperature": 0.7, "sampling.top_k": 1}, "sampling.top_k 1"),
        ({"sampling.n": 1}, None),
        ({"sampling.n": 4, "sampling.temperature": 0.6}, None),
    ],
)
def test_several_greedy_samples_are_warned_of(sets: dict, warned: str | None) -> None:
    config = build_config(EvalConfig, [], [f"{k}={v}" for k, v in sets.items()])
    warnings = config.warnings()
    if warned is None:
        assert warnings == []
        return
    (line,) = warnings
    assert f"sampling.n is 4 but decoding is greedy ({warned})" in line
    assert "pass@k (k > 1) and maj@4 only repeat pass@1" in line


def test_eval_warns_at_its_start_and_runs_all_the_same(tiny_model_dir, tmp_path) -> None:
    args = ["eval", "aime24", "--model", str(tiny_model_dir), "--limit", "1"]
    args += ["--max-tokens", "2", "--n", "2", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("warning: sampling.n is 2 but decoding is greedy"), first
    assert (tmp_path / "run" / RESULTS).is_file()


def test_config_show_warns_on_stderr() -> None:
    result = CliRunner().invoke(app, ["config", "show", "eval", "--set", "sampling.n=8"])
    assert result.exit_code == 0
    assert "warning: sampling.n is 8 but decoding is greedy" in result.stderr
    assert yaml.safe_load(result.stdout)["sampling"]["n"] == 8  # still a --config file
