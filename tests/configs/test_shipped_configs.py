"""Every config file shipped in configs/ loads into its command's config and passes that
command's checks: a renamed key or a TRL argument that no longer exists fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from collabrl.cli.options import load_config
from tests.launch import launch_two

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _command(path: Path) -> str:
    if path.parent.name == "eval":
        return "eval"
    if path.name.startswith("sft-"):
        return "train-sft"
    return f"train-{yaml.safe_load(path.read_text())['method']}"  # the command it is for


@pytest.mark.parametrize(
    "path", sorted([*CONFIGS.glob("train/*.yaml"), *CONFIGS.glob("eval/*.yaml")]), ids=str
)
def test_a_shipped_config_loads_and_passes_its_checks(path: Path) -> None:
    command = _command(path)
    # The SFT configs leave --data to the command line (the rows of a build).
    given = {"data": "runs/warmup-relay"} if command == "train-sft" else {}
    load_config(command, path, given, []).check()


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("accelerate/*.yaml")), ids=str)
def test_an_accelerate_config_names_its_launch(path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    assert config["distributed_type"] in {"MULTI_GPU", "DEEPSPEED", "MULTI_CPU"}
    assert config["num_processes"] >= 2 and config["num_machines"] == 1


@pytest.mark.slow
def test_the_cpu_launch_starts_two_processes(tmp_path: Path) -> None:
    """`accelerate launch --config_file cpu-2proc.yaml` starts two ranks of one world;
    a MULTI_CPU config without mpirun starts a single process and says nothing, and every
    two-process test would then run one."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        'import os\nprint("rank", os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))\n'
    )
    done = launch_two([str(probe)], tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert ranks == ["rank 0 2", "rank 1 2"]
