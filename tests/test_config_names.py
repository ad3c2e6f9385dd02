"""Where the shipped configs are found: the repository's configs/ in a checkout, and
`collabrl/_configs` in a wheel, where pyproject.toml puts them (as it puts data/)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from collabrl.config import config_file, configs_dir
from collabrl.data.benchmarks import data_dir

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_ships_the_configs_where_configs_dir_looks() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert shipped["configs"] == "collabrl/_configs"
    assert shipped["data"] == "collabrl/_data"  # as data_dir() finds it
    assert configs_dir() == ROOT / "configs" and data_dir() == ROOT / "data"  # a checkout


def test_a_name_resolves_only_to_a_shipped_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert config_file(Path("eval/greedy-pass1")) == configs_dir() / "eval/greedy-pass1.yaml"
    for given in ("../configs/eval/greedy-pass1", "eval", "eval/../eval/greedy-pass1"):
        assert config_file(Path(given)) == Path(given)  # no name: read (and refused) as a path
