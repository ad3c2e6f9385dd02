"""Hostile or broken code that `collab` imports, through real `collab` processes: protocol
plugins installed as pip leaves them (a module and a dist-info with entry_points.txt on
PYTHONPATH) and reward modules. A broken one is one line and is skipped or refused; every
other command works; nothing ends `collab` with exit 0 unsaid, or with a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_line_error, collab

HEADER = """
from collabrl.protocols.solo import build_solo
from collabrl.protocols.spec import Flag, ProtocolSpec
"""
# A flag of a key its (missing) options class lacks: a KeyError/TypeError traceback in
# every command that builds protocol options, before.
BAD_FLAG = (
    HEADER + 'SPEC = ProtocolSpec("bad", "h", build_solo, flags=(Flag("options.x", ("--x",)),))'
)
EXITS = "raise SystemExit(0)\n"  # before: `collab` exited 0 having done nothing
CTRL_C = "raise KeyboardInterrupt\n"


def _plugin(root: Path, source: str) -> dict[str, str]:
    """The environment of a `collab` process with the plugin `source` installed."""
    site = root / "site"
    site.mkdir()
    (site / "collab_hostile.py").write_text(source)
    dist = site / "collab_hostile-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: collab-hostile\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[collabrl.protocols]\nhostile = collab_hostile:SPEC\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def _skipped(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "skipped the protocol plugin" in line]


@pytest.mark.parametrize("source", [BAD_FLAG, EXITS], ids=["bad flag", "sys.exit"])
def test_a_broken_plugin_leaves_eval_working(
    source: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ["eval", "run", "arith", "--model", str(tiny_model_dir), "--limit", "1"]
    result = collab(
        *args, "--max-tokens", "2", "--out", "run", cwd=tmp_path, env=_plugin(tmp_path, source)
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert len(_skipped(result.stderr)) == 1
    assert (tmp_path / "run" / "samples.jsonl").is_file()  # the run was done, and kept


@pytest.mark.parametrize(
    "args", [["infer", "--help"], ["train", "grpo", "--help"], ["config", "show", "eval"]]
)
def test_a_broken_plugin_leaves_help_and_config_working(args: list[str], tmp_path: Path) -> None:
    result = collab(*args, cwd=tmp_path, env=_plugin(tmp_path, BAD_FLAG))
    assert result.returncode == 0, result.stderr
    [line] = _skipped(result.stderr)
    assert "protocol.options.x is no config field" in line


def test_the_unknown_protocol_error_names_the_plugin_that_exited(tmp_path: Path) -> None:
    result = collab(
        "infer", "hostile", "Hi", "--model", "m", cwd=tmp_path, env=_plugin(tmp_path, EXITS)
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("error: unknown protocol 'hostile'")
    assert "hostile: it exited while loading (SystemExit 0)" in result.stderr


def test_a_ctrl_c_while_a_plugin_imports_on_a_dry_run_is_one_line(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Before: "finished work is saved: re-run … with --resume", of a dry run that did none."""
    args = ["train", "grpo", "--model", str(tiny_model_dir), "--data", "arith_train", "--dry-run"]
    result = collab(*args, cwd=tmp_path, env=_plugin(tmp_path, CTRL_C))
    assert result.returncode == 130
    assert result.stderr.strip() == "error: interrupted"


# --- reward modules (`--reward-func FILE:FUNCTION`) ----------------------------------------------


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry run", "run"])
def test_a_reward_module_that_exits_at_import_is_refused(
    dry_run: bool, tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "rewards.py").write_text(EXITS)
    args = ["train", "grpo", "--model", str(tiny_model_dir), "--data", "arith_train"]
    args += ["--reward-func", "rewards.py:score", "--out", "run"]
    result = collab(*args, *(["--dry-run"] if dry_run else []), cwd=tmp_path)
    assert_one_line_error(result, "cannot import rewards.py", "SystemExit: sys.exit(0) was called")
    assert not (tmp_path / "run").exists()


def test_a_ctrl_c_while_a_reward_module_imports_on_a_dry_run_is_one_line(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "rewards.py").write_text(CTRL_C)
    args = ["train", "grpo", "--model", str(tiny_model_dir), "--data", "arith_train"]
    result = collab(*args, "--reward-func", "rewards.py:score", "--dry-run", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr.strip() == "error: interrupted"
