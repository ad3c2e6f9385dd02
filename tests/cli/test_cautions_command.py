"""The warnings where a user is about to fool themselves (issue 35), on every path that
prints them: `collab train --dry-run` lists them, and the real `collab train`,
`collab build-warmup` and `collab filter` print them before they start, one plain
`warning:` line each in a pipe (the checks themselves: tests/eval/test_cautions.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collabrl import runs
from collabrl.cli.main import app
from tests.cli.test_cli import collab

runner = CliRunner()
ENV = {"COLUMNS": "80", "NO_COLOR": "1"}  # a narrow pipe: a warning must stay one line
TEST_SPLIT = "the test split of the benchmark 'arith'"
STAND_IN = "warning: The reference collaborator is a stand-in"
UNWARMED = "was not warmed up on relay's <call>n</call>"


def _warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("warning: ")]


def _relay(model: Path, teacher: str, data: str) -> list[str]:
    return ["train", "relay", "--model", str(model), "--teacher", teacher, "--data", data]


def test_the_dry_run_lists_test_split_stand_in_and_unwarmed(tiny_model_dir: Path) -> None:
    args = [*_relay(tiny_model_dir, "reference", "arith"), "--limit", "4", "--dry-run"]
    result = runner.invoke(app, args, env=ENV)

    assert result.exit_code == 0, result.output
    warnings = _warnings(result.output)
    assert any(line.startswith("warning: training on 'arith': " + TEST_SPLIT) for line in warnings)
    assert any(line.startswith(STAND_IN) for line in warnings)
    unwarmed = [line for line in warnings if UNWARMED in line]
    # Whole, on one line, however narrow the pipe.
    assert len(unwarmed) == 1 and unwarmed[0].endswith("warmed up outside collabrl)")


def test_a_warmed_up_policy_with_a_model_teacher_on_training_data_is_not_warned(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    sft = tmp_path / "sft"
    shutil.copytree(tiny_model_dir, sft / "final")
    (sft / "config.yaml").write_text(runs.provenance() + "epochs: 1.0\n")  # `train sft`'s
    args = [*_relay(sft / "final", str(tiny_model_dir), "arith_train"), "--limit", "4"]
    result = runner.invoke(app, [*args, "--dry-run"], env=ENV)

    assert result.exit_code == 0, result.output
    shown = "\n".join(_warnings(result.output))
    assert "test split" not in shown and "stand-in" not in shown and "warmed up" not in shown


@pytest.mark.parametrize(("data", "warned"), [("arith", True), ("arith_train", False)])
def test_filter_warns_before_it_starts(data: str, warned: bool, tmp_path: Path) -> None:
    args = ["filter", "--decontaminate", "--data", data, "--limit", "3"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "out")], env=ENV)

    assert result.exit_code == 0, result.output
    expected = [f"warning: filtering '{data}': {TEST_SPLIT}"] if warned else []
    assert [line[: len(expected[0])] for line in _warnings(result.output)] == expected
    if warned:  # before the work: above the summary table
        assert result.output.index("warning:") < result.output.index("collab filter ·")


def test_build_warmup_warns_before_it_starts(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ["build-warmup", "relay", "--model", str(tiny_model_dir), "--data", "arith"]
    args += ["--limit", "1", "--max-tokens", "8", "--out", str(tmp_path / "out")]
    result = runner.invoke(app, args, env=ENV)

    assert result.exit_code == 0, result.output
    assert _warnings(result.output)[0].startswith(
        f"warning: building a warm-up set from 'arith': {TEST_SPLIT}"
    )


@pytest.mark.slow  # a real SFT step: ~9 s on 2 CPU cores
def test_sft_on_rows_built_from_a_test_split_warns(tiny_model_dir: Path, tmp_path: Path) -> None:
    warmup = tmp_path / "warmup"  # a `collab build-warmup relay --data arith` folder
    warmup.mkdir()
    (warmup / "config.yaml").write_text(runs.provenance() + "data: arith\n")
    row = {"prompt": [{"role": "user", "content": "What is 2 + 4?"}]}
    row["completion"] = [{"role": "assistant", "content": "<call>1</call> 6"}]
    (warmup / "rows.jsonl").write_text(json.dumps(row) + "\n")
    args = ["train", "sft", "--model", str(tiny_model_dir), "--data", str(warmup / "rows.jsonl")]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "sft")], env=ENV)

    assert result.exit_code == 0, result.output
    assert _warnings(result.output)[0].startswith(
        f"warning: SFT on '{warmup / 'rows.jsonl'}' (made from 'arith', "
    )


@pytest.mark.slow
def test_a_training_run_prints_the_dry_runs_warnings(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = collab(
        *_relay(tiny_model_dir, "reference", "arith"), "--limit", "2", "--steps", "1",
        "--prompts-per-step", "2", "--num-generations", "2", "--max-tokens", "8",
        "--out", "run", cwd=tmp_path,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    warnings = _warnings(result.stdout)
    assert any(TEST_SPLIT in line for line in warnings)
    assert any(line.startswith(STAND_IN) for line in warnings)
    assert any(UNWARMED in line for line in warnings)
