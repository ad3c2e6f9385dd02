"""Evidence data: the first N training and M held-out problems of each named family of
arith or arith_steps, interleaved by family (as arith is), written as OUT/train.jsonl
and OUT/test.jsonl.

    python scripts/evidence/arith_mix.py add1,add2,mul22,add3 25 20 runs/evidence/relay
    python scripts/evidence/arith_mix.py add1,add2,mul22,add3 25 20 OUT --solutions

With --solutions every row gets a `solution`: a worked solution in plain steps, one a
line (`36 × 15 = 36 × 10 + 36 × 5`, `= 360 + 180`, `= 540`), which the benchmark loader
reads as the item's solution and the `reference-continue` teacher writes from the step
the student has reached (engines/reference.py). Without it the rows are arith's, with no
solution, so that the other methods' `reference@P` experts keep answering with the
boxed answer alone.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

_SIGN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "×", ast.Div: "÷"}


def _places(n: int, width: int = 0) -> list[int]:
    """`n`'s place values, largest first, over `width` places (its own digits by default),
    zeros kept: 373 -> [300, 70, 3], 50 -> [50, 0], (7, 2) -> [0, 7]."""
    digits = str(n).zfill(width)
    return [int(d) * 10 ** (len(digits) - i - 1) for i, d in enumerate(digits)]


def _nonzero(parts: list[int]) -> list[int]:
    return [p for p in parts if p] or [0]


def _operation(a: int, op: str, b: int) -> tuple[list[str], int]:
    """One operation worked by place value: its lines and its value."""
    head = f"{a} {op} {b}"
    if op == "+":
        value = a + b
        width = max(len(str(a)), len(str(b)))
        pairs = [
            (x, y) for x, y in zip(_places(a, width), _places(b, width), strict=True) if x or y
        ]
        if len(pairs) <= 1:
            return [f"{head} = {value}"], value
        split = " + ".join(f"({x} + {y})" for x, y in pairs)
        sums = " + ".join(str(x + y) for x, y in pairs)
        return [f"{head} = {split}", f"= {sums}", f"= {value}"], value
    if op == "-":
        value = a - b
        if value < 0:
            lines, positive = _operation(b, "-", a)
            return [f"{head} = -({b} - {a})", *lines, f"so {head} = {-positive}"], value
        parts = _nonzero(_places(b))
        if len(parts) == 1:
            return [f"{head} = {value}"], value
        lines, left = [f"{head} = {a} - " + " - ".join(map(str, parts))], a
        for i, part in enumerate(parts[:-1]):
            left -= part
            lines.append(f"= {left} - " + " - ".join(map(str, parts[i + 1 :])))
        return [*lines, f"= {value}"], value
    if op == "×":
        value = a * b
        # Split the operand with more digits (the second on a tie): 67 × 7 = 60 × 7 + 7 × 7.
        split_b = len(str(b)) >= len(str(a))
        parts = _nonzero(_places(b if split_b else a))
        if len(parts) == 1:
            return [f"{head} = {value}"], value
        terms = [(a, p) if split_b else (p, b) for p in parts]
        products = " + ".join(f"{x} × {y}" for x, y in terms)
        values = " + ".join(str(x * y) for x, y in terms)
        return [f"{head} = {products}", f"= {values}", f"= {value}"], value
    # ÷: the arith problems divide exactly; the tens of the quotient first.
    value = a // b
    tens = value - value % 10
    if tens == 0 or value % 10 == 0:
        return [f"{b} × {value} = {a}", f"so {head} = {value}"], value
    lines = [f"{b} × {tens} = {b * tens}", f"{a} - {b * tens} = {a - b * tens}"]
    lines += [f"{a - b * tens} ÷ {b} = {value % 10}", f"so {head} = {tens} + {value % 10}"]
    return [*lines, f"= {value}"], value


def worked_solution(problem: str) -> tuple[str, int]:
    """A worked solution of an arith problem ("What is 30 + 7 × 4? ..."), one operation
    at a time in the order they are done, and its value."""
    expression = problem.split("What is ", 1)[1].split("?", 1)[0]
    text = expression.replace("×", "*").replace("÷", "/")
    lines: list[str] = []
    while True:
        tree = ast.parse(text, mode="eval").body
        if _number(tree) is not None:
            return "\n".join(lines), int(text)
        node = _first_operation(tree)
        left, right = _number(node.left), _number(node.right)
        assert left is not None and right is not None
        worked, value = _operation(left, _SIGN[type(node.op)], right)
        lines += worked
        # The operation's text, with its parentheses, becomes its value.
        start, end = node.col_offset, node.end_col_offset
        while start > 0 and text[start - 1] == "(" and end < len(text) and text[end] == ")":
            start, end = start - 1, end + 1
        text = text[:start] + str(value) + text[end:]
        if _number(ast.parse(text, mode="eval").body) is None:
            lines.append(f"so {_shown(expression)} = {_shown(text)}")
            expression = text


def _number(node: ast.expr) -> int | None:
    """The integer `node` writes (`-14` is a minus and a number), or None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _number(node.operand)
        return None if value is None else -value
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, int) else None


def _first_operation(node: ast.expr) -> ast.BinOp:
    """The operation done first: the leftmost one whose operands are both numbers."""
    assert isinstance(node, ast.BinOp), f"not an arith expression: {ast.dump(node)}"
    for child in (node.left, node.right):
        if _number(child) is None:
            return _first_operation(child)
    return node


def _shown(text: str) -> str:
    return text.replace("*", "×").replace("/", "÷")


def mix(families: list[str], split: str, count: int, solutions: bool) -> list[dict]:
    data = Path(__file__).resolve().parents[2] / "data"
    rows = [
        json.loads(line)
        for source in ("arith", "arith_steps")
        for line in open(data / f"{source}_{split}.jsonl", encoding="utf-8")
    ]
    kept = []
    for family in families:
        kept += [r for r in rows if r["family"] == family][:count]
    # Interleaved by family, as arith is, so that --limit takes every family.
    kept.sort(key=lambda r: (int(r["id"].rsplit("-", 1)[1]), families.index(r["family"])))
    for row in kept if solutions else ():
        row["solution"], value = worked_solution(row["problem"])
        assert str(value) == row["answer"], f"{row['id']}: worked to {value}"
    return kept


def main(argv: list[str]) -> None:
    solutions = "--solutions" in argv
    families, per_train, per_test, out = [a for a in argv if a != "--solutions"]
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", int(per_train)), ("test", int(per_test))):
        kept = mix(families.split(","), split, count, solutions)
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
        (out_dir / f"{split}.jsonl").write_text(lines, encoding="utf-8")
        print(f"{out_dir / split}.jsonl: {len(kept)} problems")


if __name__ == "__main__":
    main(sys.argv[1:])
