"""Answer checking against the test cases of the graders the papers use.

The cases (not the code) are ported from public grader test suites, as bare
(gold, prediction) pairs because our checker compares extracted answers:

- MATH: hendrycks/math, modeling/math_equivalence_test.py (`is_equiv`);
- math-verify: huggingface/Math-Verify, tests/test_all.py, tests/test_numina_cases.py
  and tests/test_open_thoughts.py (the short answers inside their full-text cases);
- golds of our own data files that an earlier checker got wrong (`\\$36`, issue 8).
"""

from __future__ import annotations

import re

import pytest

from collabrl.data.benchmarks import data_dir, load_benchmark
from collabrl.rewards.verify import is_equivalent

# (gold, prediction, equivalent)
MATH_IS_EQUIV = [
    (r"\tfrac{1}{2} + \frac1{72}", r"\\frac{1}{2} + 2/3", False),
    ("10, 4, 2", "4, 12, 2", False),
    (r"\tfrac{1}{2} +\! \frac1{72}", r"\dfrac{1}{2} +\frac{1}{72}", True),
    (r"10\text{ units}", "10 ", True),
    (r"10\text{ units}", "100 ", False),
    ("10", r"\$10", True),
    (r"\left(x-2\right)\left(x+2\right)", "(x-2)(x+2)", True),
    ("0.1", ".1", True),
    (r"10\%", "10", True),
    (r"10\sqrt{3} + \sqrt4", r"10\sqrt3 + \sqrt{4}", True),
    (r"\frac34i", r"\frac{3}{4}i", True),
    (r"\tfrac83", r"\frac{8}{3}", True),
    ("5x - 7y + 11z + 4 = 0", "x + y - z + 2 = 0", False),
    ("1/2", r"\frac{1}{2}", True),
]

# MATH's string comparison calls these different; math-verify (which we follow) compares an
# unbracketed list as a set, which "find all solutions" answers need.
MATH_IS_EQUIV_DEVIATIONS = [
    ("10, 4, -2", "4, 10, -2", True),
    ("0.1, 4, 2", "4, .1, 2", True),
]

MATH_VERIFY = [
    ("-5", "-5", True),
    ("7425000", "7,425,000", True),
    ("1000", "1000.0", True),
    ("1000.0", "1,000.0", True),
    ("0.4", ".4", True),
    ("1000.99", "1,000.99", True),
    ("1000.99", "$1,000.99", True),
    ("1000.99", "1,000.99$", True),
    ("10/9", r"\frac{10}{9}", True),
    ("-10/9", r"-\frac{10}{9}", True),
    ("[0,1)", "[0,1)", True),
    ("[0,9)", "[0,1)", False),
    ("(0,9)", "[0,9)", False),
    ("1", "-[0,1)", False),
    ("1/3", r"\frac13", True),
    ("1", r"\frac3{3}", True),
    (r"\sqrt{3}", r"\sqrt3", True),
    ("1/3", r"\cfrac{1}{3}", True),
    ("1/3", r"\dfrac{1}{3}", True),
    ("1/3", r"\tfrac{1}{3}", True),
    ("1/3", "1/3", True),
    ("1/3", r"\left( \frac{1}{3} \right)", True),
    ("1/3", r"\frac{1}{3} \text{meters}", True),
    ("1/3", r"\frac{1}{3} \textbf{meters}", True),
    ("1/3", r"k = \frac{1}{3}", True),
    (r"28\%", "28 percent", True),
    (r"28\%", "28 pct", True),
    (r"28\%", "28 %", True),
    (r"28\%", "28", True),
    ("0.28", "28", False),
    ("28/100", "28", False),
    ("28", "28/100", False),
    (r"\frac{28}{100}", "28", False),
    (r"28*\frac{1}{100}", "28", False),
    (r"90^\circ", "90", True),
    (r"15\mbox{ cm}^2", "15", True),
    (r"\text{Evelyn}", "Evelyn", True),
    (r"\sqrt{2}+\sqrt{5}", r"\sqrt 2+\sqrt 5", True),
    (r"\frac{9}{4}\pi", r"\frac94\pi", True),
    ("x >= 5", r"x \geq 5", True),
    ("x > 5", "x < 5", False),
    ("11", "x=11", True),
    ("k=1", "1", True),
    ("2x+4y-3=0", r"y=-\frac{1}{2}x+\frac{3}{4}", True),
    (r"\frac{1}{12}", "0.0833333333333333", True),
    (r"(1,\frac{9}{2})", "(1,4.5)", True),
    (r"\frac{x+2}{7}", r"\frac{x}{7}+\frac{2}{7}", True),
    (r"\tan^2(y)+1", r"\sec^2(y)", True),
    ("(a+5)(b+2)", "(+5)(b+2)", False),
    ("2", r"\frac{1+\sqrt{5}}{2}", False),
    (r"1\sqrt{19}", "1", False),
    ("x+2n+1", "x+1", False),
    ("16386.20", r"\$16,\!386.20", True),
    ("12000023", r"12,\!000,\!023", True),
    ("14916", "14{,}916", True),
    ("6,8", r"6 \text{ and } 8", True),
    ("0.06", r"0.06 \text{ yuan}", True),
]

# Golds from data/ with currency, units, percent and separators, against plain predictions.
OUR_GOLDS = [
    (r"\$36", "36", True),
    (r"\$ 36", "36", True),
    (r"\$36", "36.00", True),
    (r"\$18.90", "18.9", True),
    (r"\$32,\!348", "32348", True),
    (r"\$32,\!348", "32,348", True),
    (r"\$1,\!657", "1657", True),
    (r"11,\! 111,\! 111,\! 100", "11111111100", True),
    (r"382 \text{ dollars}", "382", True),
    (r"5.4 \text{ cents}", "5.4", True),
    (r"864 \mbox{ inches}^2", "864", True),
    (r"164 \pi \mbox{ square feet}", r"164\pi", True),
    (r"\frac{270}7\text{ degrees}", r"\frac{270}{7}", True),
    ("62.5%", "62.5", True),
    (r"17\%", "0.17", True),
    (r"4^{\circ}", "4", True),
    # ... and what must stay different.
    (r"\$36", "3.6", False),
    (r"\$36", "360", False),
    ("5", "0.5", False),
    ("0.5", "5", False),
    (r"50\%", r"0.5\%", False),
    (r"2\text{ and }3", "2", False),
    (r"\text{(C)}", "(D)", False),
    ("1.5", "1,5", False),
    ("34", "3,4", False),
]

CASES = MATH_IS_EQUIV + MATH_IS_EQUIV_DEVIATIONS + MATH_VERIFY + OUR_GOLDS


@pytest.mark.parametrize(("gold", "pred", "expected"), CASES)
def test_grader_case(gold: str, pred: str, expected: bool) -> None:
    assert is_equivalent(pred, gold) is expected


@pytest.mark.parametrize("file", ["math500.jsonl", "math_train.jsonl"])
def test_every_dollar_gold_matches_its_bare_amount(file: str) -> None:
    """Issue 8: `36` against the gold `\\$36` was judged wrong (3 golds in MATH-500, 38 in
    the MATH train split)."""
    golds = [i.answer for i in load_benchmark(str(data_dir() / file)).items if "\\$" in i.answer]
    assert len(golds) == {"math500.jsonl": 3, "math_train.jsonl": 38}[file]
    for gold in golds:
        amount = re.sub(r"\\\$|\\!|\s", "", gold)
        assert is_equivalent(amount, gold), gold
