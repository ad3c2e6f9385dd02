"""EAPO's evaluation metric in `collab eval report`: "Pass@32" (f1@32, the mean over
problems of each problem's mean F1 over 32 samples) and "Var" (var_f1, the population
variance of those per-problem means), computed by `summarize` and shown side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl.eval.metrics import ProblemSamples, summarize
from collabrl.eval.report import load_run, report_rows
from tests.eval.test_report import _run


def test_pass_at_32_and_var_are_the_papers_definitions() -> None:
    # Two problems of 32 samples: F1 1.0 on 8 samples of the first (mean 0.25), 0.5 on
    # every sample of the second (mean 0.5). Pass@32 = (0.25 + 0.5) / 2 = 0.375;
    # Var = ((0.25 - 0.375)^2 + (0.5 - 0.375)^2) / 2 = 0.015625, divided by |Q|, not |Q|-1.
    first = ProblemSamples("a", [True] * 8 + [False] * 24, [1.0] * 8 + [0.0] * 24, ["1"] * 32)
    second = ProblemSamples("b", [False] * 32, [0.5] * 32, ["2"] * 32)
    out = summarize([first, second])
    assert out["f1@32"] == pytest.approx(0.375)
    assert out["var_f1"] == pytest.approx(0.015625)


def test_the_report_shows_eapos_var_beside_its_pass_at_32(tmp_path: Path) -> None:
    run = _run(
        tmp_path / "eapo",
        "m",
        32,
        {"pass@1": 0.5, "avg@32": 0.25, "f1@32": 0.375, "var": 0.0625, "var_f1": 0.015625},
        protocol="consult",
    )
    header, [row] = report_rows([load_run(run)])
    assert header[6:] == ["pass@1", "avg@n", "f1@n", "var", "var_f1"]
    assert row[6:] == ["0.5000", "0.2500", "0.3750", "0.0625", "0.0156"]
