"""`--device` on the commands that load a local model: its help, and a mistyped device
refused in one line naming the option, before any model loads or any folder is made."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from collabrl.cli.main import app
from tests.cli.test_cli import assert_one_line_error, collab

runner = CliRunner()

COMMANDS = {
    "eval": ["eval", "arith", "--limit", "1", "--out", "run"],
    "infer": ["infer", "solo", "What is 1 + 1?"],
    "train": ["train", "grpo", "--out", "run"],
    "serve": ["serve", "expert"],
    "filter": ["filter", "--teacher", "smollm2-135m", "--data", "arith", "--out", "run"],
    "evolve": ["evolve", "arith", "--model", "smollm2-135m", "--limit", "1", "--out", "run"],
    "build-warmup": ["build-warmup", "relay", "--data", "arith", "--out", "run"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_mistyped_device_is_one_line_naming_the_option(tmp_path: Path, command: str) -> None:
    home = tmp_path / "home"  # where a model load would convert the embedded weights
    result = collab(
        *COMMANDS[command], "--device", "gpu", cwd=tmp_path, env={"COLLABRL_HOME": str(home)}
    )
    assert_one_line_error(result, "--device: engine.device must be auto, cpu, cuda, cuda:N or mps")
    assert list(tmp_path.iterdir()) == []  # no run folder, no converted model


@pytest.mark.parametrize("command", [["eval", "run"], ["infer"], ["train", "grpo"], ["serve"]])
def test_the_device_option_shows_its_config_help(command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--device" in result.stdout and "cuda when torch sees a GPU" in result.stdout
