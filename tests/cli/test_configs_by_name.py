"""Shipped configs by name: `-c eval/greedy-pass1` from any folder, as the data is read by
name; `collab config list` prints them; a path that exists wins over a name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from collabrl.cli.main import app
from collabrl.cli.options import load_config
from collabrl.config import ShippedConfig, configs_dir, shipped_configs
from tests.cli.test_cli import assert_one_line_error, collab


def _max_tokens(shown: str) -> int:
    return yaml.safe_load(shown)["sampling"]["max_tokens"]


@pytest.mark.parametrize("name", ["eval/greedy-pass1", "eval/greedy-pass1.yaml"])
def test_a_shipped_config_is_read_by_name_from_any_folder(name: str, tmp_path: Path) -> None:
    result = collab("config", "show", "eval", "-c", name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _max_tokens(result.stdout) == 8192  # the shipped file's


def test_an_eval_runs_with_a_config_by_name(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ["eval", "run", "arith", "-c", "eval/greedy-pass1", "--model", str(tiny_model_dir)]
    result = collab(*args, "--limit", "1", "--max-tokens", "2", "--out", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["prompt"] == "relay" and saved["sampling"]["n"] == 1  # from the config


def test_a_path_that_exists_wins_over_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "greedy-pass1.yaml").write_text("sampling: {max_tokens: 7}\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["config", "show", "eval", "-c", "eval/greedy-pass1.yaml"])
    assert result.exit_code == 0, result.output
    assert _max_tokens(result.output) == 7


def test_a_name_that_ships_no_config_is_a_missing_file(tmp_path: Path) -> None:
    result = collab("config", "show", "eval", "-c", "eval/no-such-config", cwd=tmp_path)
    assert_one_line_error(result, "cannot read config eval/no-such-config")


def test_config_list_prints_every_shipped_config(tmp_path: Path) -> None:
    result = collab("config", "list", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    files = sorted(configs_dir().glob("*/*.yaml"))
    assert len(files) == len(shipped_configs()) > 0
    for path in files:
        assert path.relative_to(configs_dir()).with_suffix("").as_posix() in result.stdout
    assert "│ eval/greedy-pass1 " in result.stdout and "│ train relay " in result.stdout
    assert str(configs_dir()) in result.stdout


@pytest.mark.parametrize(
    "shipped",
    [c for c in shipped_configs() if c.command != "accelerate launch"],
    ids=lambda c: c.name,
)
def test_each_listed_config_loads_into_the_command_it_is_listed_for(
    shipped: ShippedConfig,
) -> None:
    command = shipped.command.replace(" ", "-")
    given = {"data": "runs/warmup-relay"} if command == "train-sft" else {}
    load_config(command, Path(shipped.name), given, []).check()
