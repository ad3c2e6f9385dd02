"""Issue 51, "results that can be compared and reproduced": what results.json records of
a run (prompt template, chat template, data and sample hashes, examples, time, lm-eval's
keys), `--num-fewshot`, the truncation warning, and `collab eval report` telling runs
apart and fitting 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from collabrl import runs
from collabrl.cli.main import app
from collabrl.data.benchmarks import fewshot_items, load_benchmark
from collabrl.eval.provenance import data_hash, digest, task_hash
from collabrl.eval.results import RESULTS
from collabrl.eval.runner import run_eval
from collabrl.models import load_tokenizer
from tests.cli.test_cli import assert_one_line_error, collab
from tests.eval.test_results_json import _config, _results
from tests.eval.test_runner import _record


def test_results_json_holds_what_reproduces_the_run(tiny_model_dir, tiny_engine, tmp_path):
    out = tmp_path / "run"
    result = run_eval(_config(tiny_model_dir, out, num_fewshot=2), engine=tiny_engine)
    doc = _results(out)
    task = doc["configs"]["gsm8k"]
    bench = load_benchmark("gsm8k", limit=2)

    # The template as sent, its examples included, and their draw.
    shots = fewshot_items(bench, 2, 1234)
    assert task["prompt"]["name"] == "relay"
    assert task["prompt"]["system"].startswith("Please reason step by step")
    assert [s["id"] for s in task["prompt"]["shots"]] == [item.id for item in shots]
    assert task["prompt_hash"] == digest(task["prompt"])
    assert (task["num_fewshot"], doc["n-shot"]) == (2, {"gsm8k": 2})
    assert task["fewshot"] == {
        "split": "gsm8k_train",
        "seed": 1234,
        "as_multiturn": True,
        "ids": [item.id for item in shots],
    }
    # The data, the chat template, the samples.
    assert task["data_hash"] == data_hash(bench.items)
    assert doc["chat_template"] == load_tokenizer(str(tiny_model_dir)).chat_template
    assert doc["chat_template_sha"] == digest(doc["chat_template"])
    records = runs.read_records(out / runs.SAMPLES)
    for record in records:
        assert {"doc_hash", "prompt_hash", "target_hash"} <= set(record)
        assert [m["role"] for m in record["prompt"]] == [
            "system",
            *["user", "assistant"] * 2,
            "user",
        ]
    ordered = sorted(
        records, key=lambda r: ([i.id for i in bench.items].index(r["item_id"]), r["sample"])
    )
    assert doc["task_hashes"] == {"gsm8k": task_hash(ordered)}
    assert doc["total_evaluation_time_seconds"] > 0
    assert doc["git_hash"]  # this checkout's commit, wherever the command runs
    # lm-eval's keys beside ours.
    entry = doc["results"]["gsm8k"]
    assert entry["alias"] == "gsm8k"
    assert entry["exact_match,none"] == result.metrics["avg@2"] == entry["avg@2"]
    assert entry["exact_match_stderr,none"] == entry["avg@2_stderr"]
    assert entry["pass@2,none"] == entry["pass@2"]
    assert entry["exact_match,flexible-extract"] == entry["flexible-extract"]


def test_examples_in_one_turn(tiny_model_dir, tiny_engine, tmp_path) -> None:
    out = tmp_path / "run"
    config = _config(tiny_model_dir, out, num_fewshot=3, fewshot_as_multiturn="false")
    run_eval(config, engine=tiny_engine)
    record = runs.read_records(out / runs.SAMPLES)[0]
    system, user = record["prompt"]
    shots = fewshot_items(load_benchmark("gsm8k"), 3, 1234)
    assert all(item.problem in user["content"] for item in shots)
    assert user["content"].endswith(load_benchmark("gsm8k", limit=1).items[0].problem)
    assert _results(out)["configs"]["gsm8k"]["fewshot"]["as_multiturn"] is False


def test_a_protocol_without_a_template_is_refused_examples(tmp_path) -> None:
    args = ["eval", "gsm8k", "--protocol", "consult", "--set", "protocol.consult.mode=locked"]
    args += ["--num-fewshot", "2", "--out", "run"]
    assert_one_line_error(collab(*args, cwd=tmp_path), "consult protocol uses its paper's prompts")
    assert not (tmp_path / "run").exists()


def test_gsm8k_with_five_examples_through_the_cli(tiny_model_dir, tmp_path) -> None:
    """`collab eval run gsm8k --num-fewshot 5`: the examples reach the prompt, the table
    shows the truncated share, and a run that lost most samples to the budget says so."""
    out = tmp_path / "run"
    args = ["eval", "run", "gsm8k", "--num-fewshot", "5", "--model", str(tiny_model_dir)]
    result = CliRunner().invoke(
        app, [*args, "--limit", "1", "--max-tokens", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert len(_results(out)["configs"]["gsm8k"]["fewshot"]["ids"]) == 5
    assert len(runs.read_records(out / runs.SAMPLES)[0]["prompt"]) == 1 + 2 * 5 + 1
    assert "│ truncated" in result.stdout
    (warning,) = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: gsm8k: 100% of the samples were cut at the token budget")


def test_a_benchmark_without_a_training_split_is_one_line(tmp_path) -> None:
    args = ["eval", "aime24", "--num-fewshot", "2", "--out", "run"]
    assert_one_line_error(
        collab(*args, cwd=tmp_path), "benchmark 'aime24' has no training split", "gsm8k"
    )
    assert not (tmp_path / "run").exists()


# --- collab eval report ---------------------------------------------------------------------------


def _finished(model: Path, out: Path, n: int, prompt: str | None = None) -> Path:
    """A run whose samples are on disk (written here: nothing is sampled), scored by
    `collab eval` into its results.json: problem i has i of its n samples right."""
    out.mkdir(parents=True)
    items = load_benchmark("gsm8k", limit=3).items
    rows = [
        _record(item.id, s, item.answer if s < i else "0", s < i)
        for i, item in enumerate(items)
        for s in range(n)
    ]
    (out / runs.SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = {"limit": 3, "sampling.n": n} | ({"prompt": prompt} if prompt else {})
    run_eval(_config(model, out, **sets))
    return out


def test_report_warns_of_runs_with_different_prompts(tiny_model_dir, tmp_path) -> None:
    _finished(tiny_model_dir, tmp_path / "relay", 2)
    _finished(tiny_model_dir, tmp_path / "eapo", 2, prompt="eapo-eval")
    _finished(tiny_model_dir, tmp_path / "again", 2)

    alike = collab("eval", "report", "relay", "again", cwd=tmp_path)
    assert alike.returncode == 0 and alike.stderr == "", alike.stderr
    differ = collab("eval", "report", "relay", "eapo", "again", cwd=tmp_path)
    assert differ.returncode == 0, differ.stderr
    (line,) = differ.stderr.splitlines()
    assert line.startswith("warning: the gsm8k runs differ in their prompt (template or examples)")
    assert all(f"{name} " in line for name in ("relay", "eapo", "again"))

    # Model revisions (lm-eval's `model_sha`; a local model has none) and the data. A run
    # that records none (a file from before) is compared on what it records.
    for name, sha in (("eapo", "fedcba9876543210"), ("again", "0123456789abcdef")):
        doc = _results(tmp_path / name)
        doc["model_sha"] = sha
        doc["configs"]["gsm8k"]["data_hash"] = (
            "f" * 64 if name == "again" else doc["configs"]["gsm8k"]["data_hash"]
        )
        (tmp_path / name / RESULTS).write_text(json.dumps(doc))
    report = collab("eval", "report", "relay", "eapo", "again", cwd=tmp_path)
    (_, data, revision) = report.stderr.splitlines()
    assert "differ in their data: relay" in data
    assert revision.endswith(
        "differ in their model revision: eapo fedcba987654, again 0123456789ab"
    )
    # --format json carries the warnings too.
    as_json = collab("eval", "report", "relay", "eapo", "--format", "json", cwd=tmp_path)
    assert len(json.loads(as_json.stdout)["warnings"]) == 1


def test_report_at_80_columns_shows_every_pass_at_k_with_its_error(tiny_model_dir, tmp_path):
    """`COLUMNS=80 collab eval report RUN… | cat`: every pass@k of every run, each with its
    standard error, no cell cut to `…`, no line past 80 columns."""
    runs_ = [_finished(tiny_model_dir, tmp_path / f"run-{n}", n) for n in (4, 5, 2, 3)]
    result = collab("eval", "report", *map(str, runs_), cwd=tmp_path, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout
    assert max(map(len, lines)) <= 80, result.stdout
    assert f"model: {tiny_model_dir}" in lines  # whole, above the tables
    for folder in runs_:
        n = int(folder.name.split("-")[1])
        entry = _results(folder)["results"]["gsm8k"]
        for k in range(1, n + 1):
            cell = f"{entry[f'pass@{k}']:.4f} ± {entry[f'pass@{k}_stderr']:.4f}"
            rows = [line for line in lines if line.startswith(f"│ pass@{k} ")]
            assert any(cell in row for row in rows), (k, cell, rows)
    # Four runs of 15-character cells need two tables at 80 columns: each labels its rows.
    assert sum(line.startswith("│ pass@1 ") for line in lines) == 2
