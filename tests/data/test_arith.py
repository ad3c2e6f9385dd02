"""Tests for the generated arith benchmark: reproducible, correct, and no test problem in train.

Answers and overlap are checked from the problem text alone, not with the generator's code,
so a bug there cannot hide itself.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from collabrl.data.benchmarks import data_dir, load_benchmark

FAMILIES = {
    "arith": ("add1", "add2", "sub2", "mul21", "mul22", "add3", "sub2neg", "mix", "div"),
    "arith_steps": ("add1x3", "addsub1", "addmul1"),
}
SETS = {
    "arith": ("arith", "test"),
    "arith_train": ("arith", "train"),
    "arith_steps": ("arith_steps", "test"),
    "arith_steps_train": ("arith_steps", "train"),
}
COUNTS = {
    "arith": {family: 20 if family == "add1" else 50 for family in FAMILIES["arith"]},
    "arith_train": {family: 25 if family == "add1" else 400 for family in FAMILIES["arith"]},
    "arith_steps": dict.fromkeys(FAMILIES["arith_steps"], 40),
    "arith_steps_train": dict.fromkeys(FAMILIES["arith_steps"], 120),
}
PROBLEM = re.compile(r"What is (.+)\? Put your final answer within \\boxed\{\}\.")
OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "×", ast.Div: "÷"}


def _file(name: str) -> str:
    source, split = SETS[name]
    return f"{source}_{split}.jsonl"


def _rows(name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (data_dir() / _file(name)).read_text().splitlines()]


def _expression(problem: str) -> str:
    match = PROBLEM.fullmatch(problem)
    assert match, problem
    return match.group(1)


def _tree(expression: str) -> ast.expr:
    """Python's own parser reads the expression, so precedence and brackets are not ours."""
    tree = ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval").body
    for node in ast.walk(tree):
        assert isinstance(node, ast.BinOp | ast.Constant | ast.operator), expression
    return tree


def _value(expression: str) -> Fraction:
    def value(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        left, right = value(node.left), value(node.right)
        operator = OPERATORS[type(node.op)]
        return {"+": left + right, "-": left - right, "×": left * right, "÷": left / right}[
            operator
        ]

    return value(_tree(expression))


def _canonical(expression: str) -> tuple:
    """Equal for problems that differ only in the order of summands or of factors: a chain
    of + and - is its sorted signed terms, a chain of × its sorted factors."""

    def terms(node: ast.expr, sign: int, op: str) -> list[tuple]:
        kind = OPERATORS.get(type(getattr(node, "op", None)))
        if op == "+" and kind in ("+", "-"):
            right = -sign if kind == "-" else sign
            return terms(node.left, sign, op) + terms(node.right, right, op)
        if op == "×" and kind == "×":
            return terms(node.left, sign, op) + terms(node.right, sign, op)
        return [(sign, canonical(node))]

    def canonical(node: ast.expr) -> tuple:
        if isinstance(node, ast.Constant):
            return ("n", node.value)
        kind = OPERATORS[type(node.op)]
        if kind == "÷":
            return ("÷", canonical(node.left), canonical(node.right))
        op = "×" if kind == "×" else "+"
        return (op, tuple(sorted(terms(node, 1, op))))

    return canonical(_tree(expression))


def test_generator_rewrites_the_shipped_files_byte_for_byte(tmp_path: Path) -> None:
    script = data_dir() / "make_arith.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True)
    for file in map(_file, SETS):
        assert (tmp_path / file).read_bytes() == (data_dir() / file).read_bytes(), file


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_answer_is_the_integer_value_of_its_problem(name: str) -> None:
    for row in _rows(name):
        value = _value(_expression(row["problem"]))
        assert value.denominator == 1, row["id"]
        assert row["answer"] == str(value.numerator), row["id"]


@pytest.mark.parametrize("name", sorted(SETS))
def test_each_family_has_its_count_and_its_ids(name: str) -> None:
    rows = _rows(name)
    assert Counter(row["family"] for row in rows) == COUNTS[name]
    source, split = SETS[name]
    for row in rows:
        assert row["id"].startswith(f"{source}-{split}-{row['family']}-"), row["id"]
        assert row["source"] == source


@pytest.mark.parametrize("name", ["arith", "arith_train"])
def test_sub2_is_never_negative_and_sub2neg_always_is(name: str) -> None:
    signs = {(row["family"], int(row["answer"]) < 0) for row in _rows(name)}
    assert ("sub2", True) not in signs
    assert ("sub2neg", False) not in signs


@pytest.mark.parametrize("source", sorted(FAMILIES))
def test_no_problem_is_in_both_splits_or_twice_in_one(source: str) -> None:
    test, train = (
        [_canonical(_expression(row["problem"])) for row in _rows(name)]
        for name in (source, f"{source}_train")
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
    assert _canonical("1 + 2 + 3") == _canonical("3 + 1 + 2")
    assert _canonical("(2 + 6) × 4") == _canonical("4 × (6 + 2)")
    assert _canonical("(2 + 6) × 4") != _canonical("2 + 6 × 4")
    assert _canonical("6 + 9 - 7") != _canonical("6 + 7 - 9")


@pytest.mark.parametrize("name", ["arith_steps", "arith_steps_train"])
def test_step_problems_take_two_operations_and_stay_positive(name: str) -> None:
    for row in _rows(name):
        tree = _tree(_expression(row["problem"]))
        assert sum(isinstance(node, ast.BinOp) for node in ast.walk(tree)) == 2, row["id"]
        assert int(row["answer"]) > 0, row["id"]


@pytest.mark.parametrize("name", sorted(SETS))
def test_registered_benchmark_loads_the_file_in_order(name: str) -> None:
    bench = load_benchmark(name)
    rows = _rows(name)
    assert [(item.id, item.problem, item.answer) for item in bench.items] == [
        (row["id"], row["problem"], row["answer"]) for row in rows
    ]
    # Rows alternate between families, so a small --limit still samples all of them.
    families = FAMILIES[SETS[name][0]]
    assert {row["family"] for row in rows[: len(families)]} == set(families)
