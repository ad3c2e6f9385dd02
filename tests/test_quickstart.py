"""The Quickstart's numbers are what `scripts/quickstart.sh` prints.

The README's seed-0 row was once measured under one learning-rate schedule and left
standing after the default changed: a user running the first command got other numbers
and nothing noticed. This test runs the script's own command (its install step is a
no-op in an installed checkout) and reads the figures it prints against the row.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# | 0 (the default) | 0.171 → 0.288 | 29 / 9 | 0.002 | 20.8 → 11.2 |
SEED0_ROW = re.compile(
    r"^\| 0 \(the default\) \| ([\d.]+) → ([\d.]+) \| (\d+) / (\d+) \| ([<\d. ]+) \| "
    r"([\d.]+) → ([\d.]+) \|$",
    re.M,
)
# `collab train`'s held-out table and its paired line (collabrl/cli/train.py).
TABLE_ROW = r"^\s*[│|]?\s*{key}\s*[│|]\s*([\d.]+)\s*[│|]\s*([\d.]+)"
PAIRED = re.compile(r"(\d+) newly solved, (\d+) lost \(sign test p = ([\d.e-]+)")


def readme_row() -> dict[str, str]:
    """The seed-0 row of the Quickstart table, as printed on the page."""
    match = SEED0_ROW.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert match, "README's Quickstart table has no seed-0 row in the expected shape"
    start, trained, gained, lost, p, tokens_start, tokens_trained = match.groups()
    return {
        "pass@1": f"{start} → {trained}",
        "split": f"{gained} / {lost}",
        "p": p.strip(),
        "tokens": f"{tokens_start} → {tokens_trained}",
    }


def format_p(p: float) -> str:
    """The page's rounding of a p-value: three decimals, `< 0.001` below that."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def printed_row(output: str) -> dict[str, str]:
    """The same four figures from what the quickstart printed, rounded as the page is."""

    def pair(key: str, digits: int) -> str:
        match = re.search(TABLE_ROW.format(key=re.escape(key)), output, re.M)
        assert match, f"the run printed no held-out row {key!r}"
        return " → ".join(f"{float(v):.{digits}f}" for v in match.groups())

    paired = PAIRED.search(output)
    assert paired, "the run printed no newly solved / lost line"
    return {
        "pass@1": pair("pass@1", 3),
        "split": f"{paired.group(1)} / {paired.group(2)}",
        "p": format_p(float(paired.group(3))),
        "tokens": pair("mean_completion_tokens", 1),
    }


def test_printed_row_reads_the_commands_output() -> None:
    output = (
        "┃ held-out arith4 ┃ start ┃ trained ┃\n"
        "│ pass@1          │ 0.1706 │ 0.2882 │\n"
        "│ mean_completion_tokens │ 20.8118 │ 11.2059 │\n"
        "of 170 problems: 29 newly solved, 9 lost (sign test p = 0.00216: the chance ...)\n"
    )
    assert printed_row(output) == {
        "pass@1": "0.171 → 0.288",
        "split": "29 / 9",
        "p": "0.002",
        "tokens": "20.8 → 11.2",
    }
    assert format_p(3e-4) == "< 0.001"


def test_readme_has_the_seed0_row() -> None:
    assert set(readme_row()) == {"pass@1", "split", "p", "tokens"}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ten steps and two evaluations of 170 problems: ~7 min alone
def test_quickstart_prints_the_readmes_seed0_row(tmp_path: Path) -> None:
    venv = Path(sys.executable).parent.parent  # the environment running the tests
    env = {**os.environ, "COLLABRL_VENV": str(venv), "OMP_NUM_THREADS": "2", "COLUMNS": "200"}
    done = subprocess.run(
        ["bash", "scripts/quickstart.sh", "--out", str(tmp_path / "run")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert printed_row(done.stdout + done.stderr) == readme_row()
