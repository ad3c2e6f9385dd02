"""Tests for the generated arith benchmark: reproducible, correct, and no test problem in train.

Answers and overlap are checked from the problem text alone, not with the generator's code,
so a bug there cannot hide itself.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from collabrl.data.benchmarks import data_dir, load_benchmark

FILES = {"arith": "arith_test.jsonl", "arith_train": "arith_train.jsonl"}
FAMILIES = ("add1", "add2", "sub2", "mul21", "mul22", "add3", "sub2neg", "mix", "div")
COUNTS = {
    "arith": {family: 20 if family == "add1" else 50 for family in FAMILIES},
    "arith_train": {family: 25 if family == "add1" else 400 for family in FAMILIES},
}
PROBLEM = re.compile(r"What is (.+)\? Put your final answer within \\boxed\{\}\.")
TOKEN = re.compile(r"\d+|[-+×÷]")


def _rows(name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (data_dir() / FILES[name]).read_text().splitlines()]


def _expression(problem: str) -> str:
    match = PROBLEM.fullmatch(problem)
    assert match, problem
    return match.group(1)


def _terms(expression: str) -> list[tuple[int, list[tuple[str, int]]]]:
    """Signed terms, each a list of (operator, factor): "9 - 2 × 3" has +[9] and -[2, 3]."""
    tokens = TOKEN.findall(expression)
    assert " ".join(tokens) == expression, expression
    terms: list[tuple[int, list[tuple[str, int]]]] = [(1, [("×", int(tokens[0]))])]
    for operator, operand in zip(tokens[1::2], tokens[2::2], strict=True):
        if operator in "+-":
            terms.append((1 if operator == "+" else -1, [("×", int(operand))]))
        else:
            terms[-1][1].append((operator, int(operand)))
    return terms


def _value(expression: str) -> Fraction:
    """× and ÷ before + and -, as in school arithmetic."""
    total = Fraction(0)
    for sign, factors in _terms(expression):
        term = Fraction(1)
        for operator, operand in factors:
            term = term * operand if operator == "×" else term / operand
        total += sign * term
    return total


def _canonical(expression: str) -> tuple:
    """Equal for problems that differ only in the order of summands or of factors."""
    return tuple(
        sorted(
            (sign, factors[0][1], tuple(sorted(factors[1:])))
            if any(op == "÷" for op, _ in factors)
            else (sign, tuple(sorted(operand for _, operand in factors)))
            for sign, factors in _terms(expression)
        )
    )


def test_generator_rewrites_the_shipped_files_byte_for_byte(tmp_path: Path) -> None:
    script = data_dir() / "make_arith.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True)
    for file in FILES.values():
        assert (tmp_path / file).read_bytes() == (data_dir() / file).read_bytes(), file


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_answer_is_the_integer_value_of_its_problem(name: str) -> None:
    for row in _rows(name):
        value = _value(_expression(row["problem"]))
        assert value.denominator == 1, row["id"]
        assert row["answer"] == str(value.numerator), row["id"]


@pytest.mark.parametrize("name", sorted(FILES))
def test_each_family_has_its_count_and_its_ids(name: str) -> None:
    rows = _rows(name)
    assert Counter(row["family"] for row in rows) == COUNTS[name]
    split = "test" if name == "arith" else "train"
    for row in rows:
        assert row["id"].startswith(f"arith-{split}-{row['family']}-"), row["id"]
        assert row["source"] == "arith"


@pytest.mark.parametrize("name", sorted(FILES))
def test_sub2_is_never_negative_and_sub2neg_always_is(name: str) -> None:
    signs = {(row["family"], int(row["answer"]) < 0) for row in _rows(name)}
    assert ("sub2", True) not in signs
    assert ("sub2neg", False) not in signs


def test_no_problem_is_in_both_splits_or_twice_in_one() -> None:
    test, train = (
        [_canonical(_expression(row["problem"])) for row in _rows(name)] for name in FILES
    )
    assert len(set(test)) == len(test)
    assert len(set(train)) == len(train)
    assert not set(test) & set(train)


def test_canonical_form_identifies_commuted_operands() -> None:
    assert _canonical("47 + 38") == _canonical("38 + 47")
    assert _canonical("12 × 7") == _canonical("7 × 12")
    assert _canonical("14 + 9 × 6") == _canonical("14 + 6 × 9")
    assert _canonical("47 - 38") != _canonical("38 - 47")
    assert _canonical("84 ÷ 4") != _canonical("84 ÷ 21")


@pytest.mark.parametrize("name", sorted(FILES))
def test_registered_benchmark_loads_the_file_in_order(name: str) -> None:
    bench = load_benchmark(name)
    rows = _rows(name)
    assert [(item.id, item.problem, item.answer) for item in bench.items] == [
        (row["id"], row["problem"], row["answer"]) for row in rows
    ]
    # Rows alternate between families, so a small --limit still samples all of them.
    assert {row["family"] for row in rows[: len(FAMILIES)]} == set(FAMILIES)
