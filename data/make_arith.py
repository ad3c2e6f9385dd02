#!/usr/bin/env python3
"""Write arith_*.jsonl and arith_steps_*.jsonl: graded integer arithmetic for small models.

GSM8K is out of reach for a 135M-parameter model, so a CPU run shows no learning on it.
These families range from nearly solved (1-digit addition) to nearly never solved (2-digit
products), so a trained policy has room to improve at every level.

Standard library only, and deterministic: `python data/make_arith.py` rewrites the shipped
files byte for byte (tests/data/test_arith.py checks it). `--out DIR` writes elsewhere.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

# Fixed so the files never change; 9 is the issue that asked for this benchmark.
SEED = 9
SOURCE = "arith"
# The registry evaluates arith with the `plain` template (the problem alone), so the format
# request is part of the problem: under `relay`'s "reason step by step" system prompt
# SmolLM2-135M rambles past a 64-token budget and answers nothing (0 of 32 measured).
PROBLEM = "What is {expression}? Put your final answer within \\boxed{{}}."


@dataclass(frozen=True)
class Problem:
    expression: str  # as shown, e.g. "47 + 38"
    answer: int
    key: tuple[int, ...]  # equal for problems that are the same up to commuted operands


@dataclass(frozen=True)
class Family:
    name: str
    make: Callable[[random.Random], Problem]
    test: int
    train: int


def number(rng: random.Random, digits: int) -> int:
    """A number with exactly `digits` digits (1-digit numbers start at 1: adding 0 is no task)."""
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def factor(rng: random.Random) -> int:
    """A 1-digit factor from 2: multiplying by 0 or 1 is no task."""
    return rng.randint(2, 9)


def addition(a: int, b: int) -> Problem:
    return Problem(f"{a} + {b}", a + b, tuple(sorted((a, b))))


def subtraction(a: int, b: int) -> Problem:
    return Problem(f"{a} - {b}", a - b, (a, b))


def product(a: int, b: int) -> Problem:
    return Problem(f"{a} × {b}", a * b, tuple(sorted((a, b))))


def add_digits(digits: int) -> Callable[[random.Random], Problem]:
    return lambda rng: addition(number(rng, digits), number(rng, digits))


def sub2(rng: random.Random) -> Problem:
    """Larger number first, so the result is never negative."""
    low, high = sorted((number(rng, 2), number(rng, 2)))
    return subtraction(high, low)


def sub2neg(rng: random.Random) -> Problem:
    """Smaller number first: a negative result, which small models tend to report unsigned."""
    low, high = sorted(rng.sample(range(10, 100), 2))
    return subtraction(low, high)


def mul21(rng: random.Random) -> Problem:
    return product(number(rng, 2), factor(rng))


def mul22(rng: random.Random) -> Problem:
    return product(number(rng, 2), number(rng, 2))


def mix(rng: random.Random) -> Problem:
    """a + b × c: reading left to right gives (a + b) × c, so this tests precedence."""
    a, b, c = number(rng, 2), factor(rng), factor(rng)
    return Problem(f"{a} + {b} × {c}", a + b * c, (a, *sorted((b, c))))


def div(rng: random.Random) -> Problem:
    """Built from the quotient, so the division is always exact."""
    quotient, divisor = number(rng, 2), factor(rng)
    return Problem(f"{quotient * divisor} ÷ {divisor}", quotient, (quotient * divisor, divisor))


def digit(rng: random.Random) -> int:
    return rng.randint(1, 9)


def add1x3(rng: random.Random) -> Problem:
    """a + b + c in 1-digit numbers: one sum, then another."""
    a, b, c = digit(rng), digit(rng), digit(rng)
    return Problem(f"{a} + {b} + {c}", a + b + c, tuple(sorted((a, b, c))))


def addsub1(rng: random.Random) -> Problem:
    """a + b - c in 1-digit numbers, the result positive."""
    a, b = digit(rng), digit(rng)
    c = rng.randint(1, min(9, a + b - 1))
    return Problem(f"{a} + {b} - {c}", a + b - c, (*sorted((a, b)), c))


def addmul1(rng: random.Random) -> Problem:
    """(a + b) × c: the sum first, as the brackets say, then a small product."""
    a, b, c = digit(rng), digit(rng), rng.randint(2, 5)
    return Problem(f"({a} + {b}) × {c}", (a + b) * c, (*sorted((a, b)), c))


# 50 test problems per family give a per-family accuracy to within about ±7 points;
# 400 training problems per family are plenty for a CPU-sized run. add1 has only 45 distinct
# problems (unordered pairs from 1-9), so it is split 20 / 25 instead.
FAMILIES = (
    Family("add1", add_digits(1), test=20, train=25),
    Family("add2", add_digits(2), test=50, train=400),
    Family("sub2", sub2, test=50, train=400),
    Family("mul21", mul21, test=50, train=400),
    Family("mul22", mul22, test=50, train=400),
    Family("add3", add_digits(3), test=50, train=400),
    Family("sub2neg", sub2neg, test=50, train=400),
    Family("mix", mix, test=50, train=400),
    Family("div", div, test=50, train=400),
)


# Two-operation problems for rSIM's planner (issue 25), in their own files with their own
# seed so that adding them left arith's files as they were. The numbers are 1-digit:
# SmolLM2-135M already fails most chains of two 1-digit operations (3-10 % greedy), and
# 2-digit chains were 0-2 %. (a + b) × c has 180 distinct problems, hence 40 + 120.
STEP_SEED = 25
STEP_SOURCE = "arith_steps"
STEP_FAMILIES = (
    Family("add1x3", add1x3, test=40, train=120),
    Family("addsub1", addsub1, test=40, train=120),
    Family("addmul1", addmul1, test=40, train=120),
)


def distinct(family: Family, rng: random.Random) -> list[Problem]:
    """test + train problems with pairwise different keys, in the order drawn."""
    found: dict[tuple[int, ...], Problem] = {}
    while len(found) < family.test + family.train:
        problem = family.make(rng)
        found.setdefault(problem.key, problem)
    return list(found.values())


def rows(source: str, family: Family, split: str, problems: list[Problem]) -> list[dict[str, str]]:
    return [
        {
            "id": f"{source}-{split}-{family.name}-{index:04d}",
            "problem": PROBLEM.format(expression=problem.expression),
            "answer": str(problem.answer),
            # Graded as a number: `\boxed{36 × 15}` echoes the question, it does not answer it.
            "answer_type": "number",
            "family": family.name,
            "source": source,
        }
        for index, problem in enumerate(problems)
    ]


def interleave(groups: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """Round-robin over families, so `--limit N` takes every family, not only the first."""
    return [row for layer in zip_longest(*groups) for row in layer if row is not None]


def write_jsonl(path: Path, records: list[dict[str, str]]) -> None:
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    path.write_text(text, encoding="utf-8", newline="\n")


def write_set(out: Path, source: str, families: tuple[Family, ...], seed: int) -> None:
    """SOURCE_test.jsonl and SOURCE_train.jsonl of these families."""
    # One generator for all families, drawn in their order: adding a family at the end
    # leaves every earlier problem as it was.
    rng = random.Random(seed)
    test, train = [], []
    for family in families:
        problems = distinct(family, rng)
        # Test is the first draws, train the rest: no key is in both, by construction.
        test.append(rows(source, family, "test", problems[: family.test]))
        train.append(rows(source, family, "train", problems[family.test :]))
    write_jsonl(out / f"{source}_test.jsonl", interleave(test))
    write_jsonl(out / f"{source}_train.jsonl", interleave(train))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    write_set(out, SOURCE, FAMILIES, SEED)
    write_set(out, STEP_SOURCE, STEP_FAMILIES, STEP_SEED)


if __name__ == "__main__":
    main()
