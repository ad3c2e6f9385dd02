"""A protocol from its own package: examples/collab-echo, installed as a user would install
it (pip, from its folder), reaches `collab` through its entry point alone and runs through
infer, eval, the training dry run and one real GRPO step, every one a real `collab`
process. Nothing in collabrl names it: its flag (`--echo`), help and options come from its
spec.

The package is installed once per session into a folder of its own (`pip --target`, no
network, no build isolation: setuptools is in the environment), which the processes see on
PYTHONPATH; the environment itself is left as it was.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from collabrl import runs
from tests.cli.test_cli import collab

EXAMPLE = Path(__file__).parents[2] / "examples" / "collab-echo"
# The field help of the plugin's collaborator, as its options class declares it.
ECHO_HELP = "echo: the collaborator that repeats the policy's answer"


@pytest.fixture(scope="session")
def echo_plugin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a `collab` process that has the example plugin installed."""
    root = tmp_path_factory.mktemp("collab-echo")
    source = root / "source"  # pip builds in the source folder: never in the repo's
    shutil.copytree(EXAMPLE, source)
    target = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    pip += ["--no-build-isolation", "--target", str(target), str(source)]
    subprocess.run(pip, check=True, capture_output=True, text=True, timeout=300)
    return {"PYTHONPATH": str(target)}


def _flat(help_text: str) -> str:
    """Help text without its box and line breaks, so that wrapped sentences read whole."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", help_text).split())


# --- fast: the plugin's options and help, from its spec ------------------------------------------


@pytest.mark.parametrize("command", [["infer"], ["eval", "run"], ["train", "grpo"]])
def test_help_shows_the_plugins_flag(command: list[str], echo_plugin, tmp_path: Path) -> None:
    result = collab(*command, "--help", cwd=tmp_path, env=echo_plugin)
    assert result.returncode == 0, result.stderr
    shown = _flat(result.stdout)
    assert "--echo" in shown
    assert ECHO_HELP in shown  # the options field's own help
    assert "echo: the policy answers and a collaborator" in shown  # --protocol's help


def test_a_method_of_another_protocol_has_no_echo(echo_plugin, tmp_path: Path) -> None:
    result = collab("train", "relay", "--help", cwd=tmp_path, env=echo_plugin)
    assert result.returncode == 0, result.stderr
    assert "--teacher" in result.stdout and "--echo" not in result.stdout


def test_config_show_expands_the_plugins_options(echo_plugin, tmp_path: Path) -> None:
    result = collab(
        "config", "show", "eval", "--set", "protocol.name=echo", cwd=tmp_path, env=echo_plugin
    )
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)["protocol"]
    assert shown["options"] == {"echo": None, "repeat": 1, "timeout": 600.0}
    assert f"# {ECHO_HELP}" in result.stdout
    # The plugin's check names its flag; `config show` has none, so it says `--set`.
    assert "pass --set protocol.options.echo=MODEL_OR_URL" in result.stderr


def test_its_check_names_its_flag(echo_plugin, tmp_path: Path) -> None:
    result = collab("infer", "echo", "Hi", "--model", "x", cwd=tmp_path, env=echo_plugin)
    assert result.returncode != 0
    assert result.stderr.strip() == (
        "error: the echo protocol needs a collaborator; pass --echo MODEL_OR_URL"
    )


# --- slow: a real model through every command ----------------------------------------------------


@pytest.mark.slow
def test_echo_runs_through_collab_infer(echo_plugin, tiny_model_dir: Path, tmp_path: Path) -> None:
    model = str(tiny_model_dir)
    args = ["infer", "echo", "What is 2+3?", "--model", model, "--echo", model]
    result = collab(*args, "--max-tokens", "12", "--json", cwd=tmp_path, env=echo_plugin)
    assert result.returncode == 0, result.stderr
    episode = json.loads(result.stdout.strip().splitlines()[-1])
    assert episode["meta"]["protocol"] == "echo"
    authors = [segment["author"] for segment in episode["segments"]]
    assert authors[0] == "policy" and "expert" in authors[1:]  # the policy's model echoed it


@pytest.mark.slow
def test_echo_runs_through_collab_eval(echo_plugin, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["eval", "arith", "--protocol", "echo", "--echo", "reference", "--limit", "2"]
    args += ["--model", str(tiny_model_dir), "--max-tokens", "8", "--out", str(out)]
    result = collab(*args, cwd=tmp_path, env=echo_plugin)
    assert result.returncode == 0, result.stderr
    samples = runs.read_records(out / runs.SAMPLES)
    assert len(samples) == 2
    for sample in samples:
        authors = [segment["author"] for segment in sample["episode"]["segments"]]
        assert sample["episode"]["meta"]["protocol"] == "echo"
        assert authors == ["policy", "expert"]  # the stand-in echoed, in its share of 8 tokens
    assert "stand-in" in result.stdout  # the reference stand-in is said to be one


GRPO = ["train", "grpo", "--protocol", "echo", "--echo", "reference", "--data", "arith_train"]
STEP = ["--limit", "4", "--steps", "1", "--prompts-per-step", "2", "--num-generations", "2"]


@pytest.mark.slow
def test_echo_training_dry_run(echo_plugin, tiny_model_dir: Path, tmp_path: Path) -> None:
    result = collab(
        *GRPO, "--model", str(tiny_model_dir), "--dry-run", cwd=tmp_path, env=echo_plugin
    )
    assert result.returncode == 0, result.stderr
    assert "echo" in result.stdout and "reference stand-in" in result.stdout  # who runs where
    assert "dry run: nothing was loaded or trained" in result.stdout


@pytest.mark.slow
def test_echo_trains_one_grpo_step(echo_plugin, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [*GRPO, *STEP, "--model", str(tiny_model_dir), "--max-tokens", "8"]
    result = collab(*args, "--out", str(out), cwd=tmp_path, env=echo_plugin, timeout=600)
    assert result.returncode == 0, result.stderr
    assert (out / "final").is_dir()
    steps = [r for r in runs.read_records(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in steps] == [1]
