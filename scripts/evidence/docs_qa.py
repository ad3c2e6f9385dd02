"""Evidence data for AlphaApollo's retrieve tool: questions whose answer is in the shipped
documentation corpus (collabrl/tools/corpus.py) and not in the question, written as
OUT/train.jsonl and OUT/test.jsonl.

    python scripts/evidence/docs_qa.py 40 20 runs/evidence/apollo-docs [--seed 0]

A question asks for the default value of one parameter of a library function ("What is
the default value of the `rtol` parameter of numpy.isclose?"). The gold answer is the
function's own signature (`inspect.signature`), and a question is kept only if the
retrieve tool, asked the question itself (the arms' tool: BM25, raw chunks, top 3, cut to
what the policy is shown), returns a chunk that names the function and spells the
parameter with its default (`rtol=1e-05`): the task is solvable by retrieval. The share
kept is printed. Functions are split into train and test before any question is made, so
no function has questions on both sides.

Ids are `docs-SPLIT-FAMILY-NNNN` (`docs-test-numpy-0003`), FAMILY one of numpy, scipy,
sympy and stdlib (math, cmath, fractions, itertools), so that `collab eval report --by
'docs-\\w+-(\\w+)-'` splits them. Grading (rewards/verify.py) is chosen per answer:

- an integer or a decimal float (`3`, `0.5`): `answer_type: number`, the gold written as
  Python writes it (`0.5`), so `0.50` is right and `0.6` is not;
- a float in exponent form (`1e-05`): `math` with that gold, kept only when the corpus's
  spelling and Python's grade as equal both ways (`1e-8` and `1e-08` do; numpy's `1.e-5`
  does not, so its questions are dropped). `0.00001` is graded wrong against `1e-05`
  (math-verify reads `e` as Euler's number): a known limit, met only by a policy that
  rewrites the value it read;
- True, False, None and strings: `math` with the gold in `\\text{}` (`\\text{auto}`),
  which accepts `auto`, `'auto'` and `"auto"` and rejects another word, even one of the
  same letters (a gold `'auto'` would accept `'tuao'`: math-verify multiplies the letters).

One value must not answer most questions (None and False are common defaults): each
value is at most MAX_SHARE of a family's questions, and the printed "modal" accuracy is
what answering the commonest training value everywhere would score on the test set.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import math
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from collabrl.protocols.apollo import FEW_SHOT, shown_text
from collabrl.protocols.apollo_config import ApolloConfig
from collabrl.rewards.verify import is_equivalent, is_number
from collabrl.tools.retrieval import RetrievalConfig, RetrievalTool

# The modules whose public functions are asked about, by family; the repo is the
# retrieve tool's `repo_name` that holds each module's text.
MODULES: dict[str, tuple[str, ...]] = {
    "numpy": ("numpy", "numpy.linalg", "numpy.fft", "numpy.random", "numpy.polynomial"),
    "scipy": (
        "scipy.linalg",
        "scipy.optimize",
        "scipy.integrate",
        "scipy.interpolate",
        "scipy.signal",
        "scipy.stats",
        "scipy.fft",
        "scipy.spatial",
        "scipy.ndimage",
    ),
    "sympy": ("sympy",),
    "stdlib": ("math", "cmath", "fractions", "itertools"),
}
PER_FUNCTION = 2  # questions a function gives at most: many functions, not many of one
MAX_SHARE = 0.1  # of a family's questions that one answer value may have
MAX_STRING = 20  # longer string defaults are prose, not a value to copy
QUESTION = (
    "What is the default value of the `{param}` parameter of {function}? "
    "Look it up in the {repo} documentation and answer with the value as the signature "
    "writes it."
)
_WORD = re.compile(r"[A-Za-z_][\w-]*")
# A literal as source or pydoc writes it after `name=`: a quoted string, a number, a name.
# The exponent form first: `[\w.]+` alone would stop at `1e` of `1e-05`.
_LITERAL = r"('[^'\n]*'|\"[^\"\n]*\"|[-+]?\d[\d.]*[eE][-+]?\d+|[-+]?[\w.]+)"


@dataclass(frozen=True)
class Question:
    family: str
    repo: str
    function: str  # qualified: numpy.isclose
    param: str
    default: object

    @property
    def problem(self) -> str:
        return QUESTION.format(param=self.param, function=self.function, repo=self.repo)


def functions(family: str) -> Iterator[tuple[str, str, object]]:
    """(repo, qualified name, function) of every public function of the family, once each."""
    seen: set[int] = set()
    for module_name in MODULES[family]:
        module = importlib.import_module(module_name)
        repo = module_name.split(".")[0]
        for name in sorted(dir(module)):
            value = getattr(module, name, None)
            if name.startswith("_") or not callable(value) or inspect.isclass(value):
                continue
            qualified = f"{module_name}.{name}"
            # numpy.linalg.norm is also reachable elsewhere; the worked retrieve call of
            # the warm-up's prompt (apollo.aid_tool) must not answer a question.
            if id(value) in seen or qualified in FEW_SHOT["retrieve"]:
                continue
            seen.add(id(value))
            yield repo, qualified, value
        if module_name == "fractions":  # its API is a class: its methods are the functions
            for name in ("from_float", "from_decimal"):
                yield repo, f"fractions.Fraction.{name}", getattr(module.Fraction, name)


def askable(default: object) -> bool:
    """A default a question can ask for: a short literal the grader can judge."""
    if default is None or isinstance(default, bool | int):
        return True
    if isinstance(default, float):
        return math.isfinite(default)
    # A word (`auto`, `two-sided`): the grader reads `'1111100'` in \text{} as a number.
    return (
        isinstance(default, str) and len(default) <= MAX_STRING and bool(_WORD.fullmatch(default))
    )


def questions_of(family: str, repo: str, function: str, value: object) -> list[Question]:
    try:
        parameters = inspect.signature(value).parameters.values()
    except (TypeError, ValueError):  # C functions without a text signature
        return []
    found = [
        Question(family, repo, function, p.name, p.default)
        for p in parameters
        if p.default is not inspect.Parameter.empty and askable(p.default)
    ]
    # Not a default the question itself says (`'default'`, a parameter named like its value).
    found = [q for q in found if str(q.default).lower() not in _words(q.problem)]
    # Values other than None/True/False first: they are what only the documentation says.
    found.sort(key=lambda q: q.default is None or isinstance(q.default, bool))
    return found[:PER_FUNCTION]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[\w.+-]+", text.lower()))


def gold(default: object) -> tuple[str, str]:
    """(answer, answer_type) for a default value (see the module docstring)."""
    if type(default) is int:  # not bool, an int subclass
        return str(default), "number"
    if isinstance(default, float):
        text = repr(default)
        return text, "number" if is_number(text) else "math"
    return f"\\text{{{default}}}", "math"


def short_name(function: str) -> str:
    return function.rsplit(".", 1)[1]


def spelled(question: Question, text: str) -> str | None:
    """How `text` spells the parameter with its default (`1.e-5`), if it names the
    function and does; None otherwise."""
    if f"{short_name(question.function)}(" not in text:
        return None
    pattern = rf"(?<![\w.]){re.escape(question.param)}\s*=\s*{_LITERAL}"
    for match in re.finditer(pattern, text):
        try:
            literal = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            continue
        if type(literal) is type(question.default) and literal == question.default:
            return match.group(1)
    return None


def solvable(question: Question, tool: RetrievalTool, limit: int) -> bool:
    """Whether the retrieve tool, asked the question, shows the answer, in a spelling the
    grader takes for the gold (both ways: the policy may copy either)."""
    result = tool.call({"repo_name": question.repo, "query": question.problem})
    spelling = spelled(question, shown_text(result, limit))
    if spelling is None:
        return False
    answer, answer_type = gold(question.default)
    return is_equivalent(spelling, answer, answer_type=answer_type) and (
        answer_type == "number" or is_equivalent(answer, spelling)
    )


def row(split: str, index: int, question: Question) -> dict[str, str]:
    answer, answer_type = gold(question.default)
    return {
        "id": f"docs-{split}-{question.family}-{index:04d}",
        "problem": question.problem,
        "answer": answer,
        "answer_type": answer_type,
        "source": "docs_qa",
        "family": question.family,
        "function": question.function,
        "repo": question.repo,
    }


def generate(
    per_train: int,
    per_test: int,
    seed: int,
    families: tuple[str, ...] = tuple(MODULES),
    apollo: ApolloConfig | None = None,
    test_share: float = 0.4,
) -> tuple[dict[str, list[dict[str, str]]], dict[str, tuple[int, int]]]:
    """Rows per split, and per family (questions checked, kept after the retrieval check).

    Questions are checked in a seeded order until a split has its count, so the share
    kept is over the questions checked."""
    apollo = apollo or ApolloConfig()
    # The arms' tool: BM25 and no helper model (the chunks themselves), its top_k, and
    # the characters of its reply the policy is shown.
    tool = RetrievalTool(apollo.retrieval)
    splits: dict[str, list[Question]] = {"train": [], "test": []}
    tried: dict[str, tuple[int, int]] = {}
    for family in families:
        listed = sorted(functions(family), key=lambda f: f[1])
        # Split by the function's own name, so that math.isclose and cmath.isclose (the
        # same question twice) land on one side.
        names = sorted({short_name(name) for _, name, _ in listed})
        # A generator per family: a family's split does not depend on which others are asked.
        random.Random(f"{seed}-{family}").shuffle(names)
        held_out = set(names[: round(test_share * len(names))])
        order = {name: i for i, name in enumerate(names)}
        listed.sort(key=lambda f: (order[short_name(f[1])], f[1]))
        sides = {
            "test": [f for f in listed if short_name(f[1]) in held_out],
            "train": [f for f in listed if short_name(f[1]) not in held_out],
        }
        asked = kept = 0
        for split, wanted in (("train", per_train), ("test", per_test)):
            # No value over MAX_SHARE of what the split asks of the family.
            most, counts = max(1, int(MAX_SHARE * wanted)), Counter()
            found = [
                q
                for repo, name, value in sides[split]
                for q in questions_of(family, repo, name, value)
            ]
            for question in found:
                if counts.total() == wanted:
                    break
                if counts[repr(question.default)] == most:
                    continue
                asked += 1
                if solvable(question, tool, apollo.max_response_chars):
                    counts[repr(question.default)] += 1
                    splits[split].append(question)
            kept += counts.total()
        tried[family] = (asked, kept)
    rows = {
        split: [row(split, i, q) for i, q in enumerate(_interleaved(questions))]
        for split, questions in splits.items()
    }
    return rows, tried


def _interleaved(questions: list[Question]) -> list[Question]:
    """Round-robin over families, so that --limit takes every family."""
    by_family: dict[str, list[Question]] = {}
    for question in questions:
        by_family.setdefault(question.family, []).append(question)
    order = []
    for rank in range(max(map(len, by_family.values()), default=0)):
        order += [qs[rank] for qs in by_family.values() if rank < len(qs)]
    return order


def modal_accuracy(rows: dict[str, list[dict[str, str]]]) -> float:
    """Test accuracy of always answering the commonest training answer."""
    commonest = Counter(r["answer"] for r in rows["train"]).most_common(1)[0][0]
    test = rows["test"]
    return sum(r["answer"] == commonest for r in test) / max(1, len(test))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("per_train", type=int, help="training questions per family (at most)")
    parser.add_argument("per_test", type=int, help="held-out questions per family (at most)")
    parser.add_argument("out", type=Path, help="folder for train.jsonl and test.jsonl")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    parser.add_argument(
        "--families", default=",".join(MODULES), help="comma-separated families to ask about"
    )
    parser.add_argument(
        "--top-k", type=int, default=RetrievalConfig.top_k, help="chunks a retrieve call returns"
    )
    parser.add_argument(
        "--max-response-chars",
        type=int,
        default=ApolloConfig.max_response_chars,
        help="characters of the reply the policy is shown (protocol.apollo.max_response_chars)",
    )
    args = parser.parse_args(argv)
    families = tuple(args.families.split(","))
    unknown = set(families) - set(MODULES)
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}; use {', '.join(MODULES)}")
    apollo = ApolloConfig(
        retrieval=RetrievalConfig(top_k=args.top_k), max_response_chars=args.max_response_chars
    )
    rows, tried = generate(args.per_train, args.per_test, args.seed, families, apollo)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, kept in rows.items():
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept)
        (args.out / f"{split}.jsonl").write_text(lines, encoding="utf-8")
        families = Counter(r["family"] for r in kept)
        print(f"{args.out / split}.jsonl: {len(kept)} questions {dict(families)}")
    for family, (asked, kept) in tried.items():
        print(f"{family}: {kept}/{asked} questions solvable by retrieval ({kept / asked:.0%})")
    print(f"modal answer on the test set: {modal_accuracy(rows):.3f}")


if __name__ == "__main__":
    main()
