"""`collab filter`, run as a user runs it (the library's cases are in tests/builders)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from collabrl.cli.main import app
from collabrl.data.benchmarks import load_benchmark
from collabrl.runs import read_records
from tests.cli.test_cli import assert_one_line_error, collab
from tests.servers import free_port

runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def test_reference_teacher_then_a_new_threshold_without_sampling(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["filter", "--teacher", "reference", "--data", "arith", "--limit", "4", "--k", "2"]
    args += ["--max-tokens", "64", "--out", str(out)]

    first = runner.invoke(app, args, env=ENV)

    assert first.exit_code == 0, first.output
    assert "kept" in first.output and "stand-in" in first.output
    assert "8 new samples" in first.output
    assert len(read_records(out / "rows.jsonl")) == 4

    again = runner.invoke(app, [*args, "--threshold", "1"], env=ENV)

    assert again.exit_code == 0, again.output
    assert "0 new samples" in again.output
    assert json.loads((out / "stats.json").read_text())["threshold"] == 1.0


def test_decontaminate_alone_writes_the_clean_rows(tmp_path: Path) -> None:
    leak = load_benchmark("arith").items[0]
    data = tmp_path / "mine.jsonl"
    rows = [
        {"id": "leak", "problem": leak.problem, "answer": leak.answer},
        {"id": "clean", "problem": "A train goes 60 miles per hour for 3 hours.", "answer": "180"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"

    result = runner.invoke(
        app, ["filter", "--decontaminate", "--data", str(data), "--out", str(out)], env=ENV
    )

    assert result.exit_code == 0, result.output
    assert "contaminated (dropped)" in result.output
    assert [r["id"] for r in read_records(out / "rows.jsonl")] == ["clean"]
    assert [r["benchmark"] for r in read_records(out / "dropped.jsonl")] == ["arith"]


def test_data_in_its_own_columns_and_a_named_split(tmp_path: Path) -> None:
    import datasets

    rows = [{"q": "A train goes 60 miles per hour for 3 hours.", "a": "180", "key": "k1"}]
    folder = tmp_path / "dsd"
    splits = {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows)}
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    columns = ["--set", "problem_field=q", "--set", "answer_field=a", "--set", "id_field=key"]
    args = ["filter", "--decontaminate", "--data", str(folder), *columns]
    unnamed = runner.invoke(app, [*args, "--out", str(tmp_path / "r1")], env=ENV)
    assert "holds the splits train, test" in str(unnamed.exception)
    named = runner.invoke(app, [*args, "--set", "split=train", "--out", str(tmp_path / "r2")])
    assert named.exit_code == 0, named.output
    assert [r["id"] for r in read_records(tmp_path / "r2" / "rows.jsonl")] == ["k1"]


def test_an_unreachable_teacher_is_one_line_and_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--data", "arith", "--limit", "2", "--k", "1", "--out", str(out)]
    done = runner.invoke(app, ["filter", "--teacher", "reference", *args], env=ENV)
    assert done.exit_code == 0, done.output
    samples = (out / "samples.jsonl").read_text()

    url = f"http://127.0.0.1:{free_port()}/v1"
    result = collab("filter", "--teacher", url, *args, cwd=tmp_path)

    assert result.returncode == 2
    assert_one_line_error(result, "cannot reach", url)
    assert (out / "samples.jsonl").read_text() == samples


def test_nothing_to_do_and_bad_values_are_one_line(tmp_path: Path) -> None:
    result = collab("filter", "--data", "arith", cwd=tmp_path)
    assert_one_line_error(result, "nothing to do", "--decontaminate")
    result = collab("filter", "--teacher", "reference", "--k", "0", cwd=tmp_path)
    assert_one_line_error(result, "--k")
    assert not (tmp_path / "runs").exists()


def test_a_band_of_pass_rates_then_a_bad_band_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["filter", "--teacher", "reference", "--data", "arith", "--limit", "2", "--k", "2"]
    args += ["--max-tokens", "64", "--out", str(out), "--threshold", "0.2"]

    # The reference teacher is always right: every problem is above a band ending at 0.6.
    result = runner.invoke(app, [*args, "--max-threshold", "0.6"], env=ENV)

    assert result.exit_code == 0, result.output
    assert "above max threshold 0.6" in result.output
    assert read_records(out / "rows.jsonl") == []
    assert json.loads((out / "stats.json").read_text())["above_max_threshold"] == 2

    bad = collab(*args[:-2], "--threshold", "0.6", "--max-threshold", "0.2", cwd=tmp_path)

    assert_one_line_error(bad, "--max-threshold", "0.2")
    # Refused before the folder is touched: the last run's stats stand.
    assert json.loads((out / "stats.json").read_text())["max_threshold"] == 0.6
