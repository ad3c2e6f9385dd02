"""`collab tools index|retrieve`, run on the sub-app as a user runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from collabrl.cli.tools import app
from collabrl.errors import UserError

runner = CliRunner()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A fresh $COLLABRL_HOME, so no test reads or writes the user's indexes."""
    return {"COLLABRL_HOME": str(tmp_path), "COLUMNS": "200", "NO_COLOR": "1"}


def test_index_builds_then_finds_the_index_fresh(env: dict[str, str], tmp_path: Path) -> None:
    args = ["index", "--repo", "cmath", "--repo", "math"]

    first = runner.invoke(app, args, env=env)
    again = runner.invoke(app, args, env=env)

    assert first.exit_code == 0, first.output
    assert first.output.count("built") == 2 and "python-" in first.output
    assert again.output.count("fresh") == 2 and "built" not in again.output
    assert (tmp_path / "retrieval" / "bm25" / "math" / "index.json").is_file()


def test_retrieve_raw_prints_the_cited_chunks(env: dict[str, str]) -> None:
    query = "closest fraction with denominator at most a maximum"

    result = runner.invoke(app, ["retrieve", "fractions", query, "--top-k", "1"], env=env)

    assert result.exit_code == 0, result.output
    assert result.output.startswith("[1] ")
    assert "limit_denominator" in result.output and "[2] " not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retrieve", "networkx", "shortest path"], "is not one of [sympy"),
        (["retrieve", "math", "gcd", "--top-k", "99"], "top_k must be an integer"),
        (["index", "--repo", "networkx"], "unknown repo 'networkx'"),
        (["index", "--backend", "faiss"], "unknown retrieval backend 'faiss'"),
        (["index", "--chunk-words", "10", "--overlap-words", "10"], "bad chunking"),
    ],
)
def test_bad_input_is_a_user_error(env: dict[str, str], args: list[str], message: str) -> None:
    result = runner.invoke(app, args, env=env)

    assert isinstance(result.exception, UserError), result.output
    assert message in str(result.exception)
