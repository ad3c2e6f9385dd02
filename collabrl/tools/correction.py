"""AlphaApollo's error correction for model-written Python (§2.2, appendix B.1).

Rule-based, before the code runs: the errors a rule can fix without guessing —
markdown fences around the code and stray indentation (the paper's rules, §2.2), a
bare last expression that a notebook would have printed and the usual imports left
out (this project's rules, not the paper's: small models make both mistakes often).
Each rule keeps the code only if it still compiles, so valid code never comes out worse.

Model-based, after a run-time error: for the error types the paper names, a fixed
note on the likely cause (the paper quotes the NameError one) and, when a model is
given, the model's own reading of the code and traceback, for the policy to act on.
"""

from __future__ import annotations

import ast
import builtins
import re
import textwrap
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from collabrl.engines.base import Engine, SamplingParams
from collabrl.tools.corpus import REPOS

# ----------------------------------------------------------------------------- rules

# Any language tag: a block tagged `text` or `Python` is still the code the model meant.
# The header is matched atomically: its two blank runs could split a line of spaces in
# quadratically many ways before `\n` fails ("```" and 64k spaces took seconds), and
# no shorter split can be followed by a newline, so none is worth retrying.
_FENCE = re.compile(r"```(?>[ \t]*[\w.+-]*[ \t]*)\n(.*?)(?:```|\Z)", re.DOTALL)

# Names models use without importing them, and the import that binds each.
COMMON_IMPORTS = {
    "math": "import math",
    "cmath": "import cmath",
    "itertools": "import itertools",
    "fractions": "import fractions",
    "Fraction": "from fractions import Fraction",
    "np": "import numpy as np",
    "numpy": "import numpy",
    "sp": "import sympy as sp",
    "sympy": "import sympy",
    "scipy": "import scipy",
    "symbols": "from sympy import symbols",
    "Symbol": "from sympy import Symbol",
    "solve": "from sympy import solve",
    "simplify": "from sympy import simplify",
    "Rational": "from sympy import Rational",
    "Eq": "from sympy import Eq",
    "comb": "from math import comb",
    "factorial": "from math import factorial",
    "gcd": "from math import gcd",
    "isqrt": "from math import isqrt",
    "sqrt": "from math import sqrt",
    "permutations": "from itertools import permutations",
    "combinations": "from itertools import combinations",
    "product": "from itertools import product",
}


@dataclass
class Correction:
    """The code to run and the names of the rules that changed it, in order."""

    code: str
    fixes: list[str] = field(default_factory=list)


def compiles(code: str) -> bool:
    try:
        compile(code, "<code>", "exec")
    except (SyntaxError, ValueError):  # ValueError: null bytes in the source
        return False
    return True


def strip_fences(code: str) -> str:
    """The code inside markdown fences (every fenced block, joined), or the code
    without stray fence lines when no block is opened properly."""
    if compiles(code):  # a fence inside a string literal is data, not markdown
        return code
    blocks = _FENCE.findall(code)
    if blocks:
        return "\n".join(b.strip("\n") for b in blocks) + "\n"
    # keepends: code with no fence line comes back exactly as given, not as a "fix"
    lines = code.splitlines(keepends=True)
    return "".join(line for line in lines if not line.strip().startswith("```"))


def fix_indentation(code: str, max_passes: int = 100) -> str:
    """Repair indentation line by line where the compiler points: an unexpected indent
    takes the previous line's indent; a block missing its indent gets one more level;
    an unindent that matches no level takes the nearest outer one."""
    if compiles(code):  # dedent would still blank whitespace-only lines inside strings
        return code
    code = textwrap.dedent(code)
    lines = code.splitlines()
    for _ in range(max_passes):
        try:
            compile("\n".join(lines), "<code>", "exec")
            break
        except IndentationError as err:
            if err.lineno is None or not 1 <= err.lineno <= len(lines):
                break
            lines = _reindent(lines, err.lineno - 1, err.msg)
        except SyntaxError:
            break
    return "\n".join(lines) + ("\n" if code.endswith("\n") else "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _reindent(lines: list[str], at: int, message: str) -> list[str]:
    above = [line for line in lines[:at] if line.strip() and not line.lstrip().startswith("#")]
    previous = _indent(above[-1]) if above else 0
    if "expected an indented block" in message:
        target = previous + 4
    elif "unindent does not match" in message:
        levels = sorted({_indent(line) for line in above if _indent(line) < _indent(lines[at])})
        target = levels[-1] if levels else 0
    else:  # unexpected indent
        target = previous
    return [*lines[:at], " " * target + lines[at].lstrip(), *lines[at + 1 :]]


def print_last_expression(code: str) -> str:
    """Print a bare last expression, as a notebook shows it (None stays silent).

    This project's rule, not the paper's."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    call = last.value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print":
        return code
    lines = code.splitlines()
    expression = ast.get_source_segment(code, last.value)
    if expression is None or last.end_lineno is None:
        return code
    head = lines[: last.lineno - 1]
    # Statements before it on its line (`a = 1; a`) stay; col_offset counts UTF-8 bytes.
    before = lines[last.lineno - 1].encode()[: last.col_offset].decode().rstrip().rstrip(";")
    if before.strip():
        head.append(before)
    # The expression keeps a line of its own, so a traceback quotes the model's text.
    shown = f"__value = (\n{expression}\n)\nif __value is not None:\n    print(__value)"
    return "\n".join([*head, shown, *lines[last.end_lineno :]]) + "\n"


def add_missing_imports(code: str) -> str:
    """Prepend the imports of common names the code reads but never binds.

    This project's rule, not the paper's."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    if any(isinstance(n, ast.ImportFrom) and n.names[0].name == "*" for n in ast.walk(tree)):
        return code  # a star import may bind anything
    loaded, bound = set(), set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    missing = sorted(name for name in loaded - bound if name in COMMON_IMPORTS)
    if not missing:
        return code
    return "\n".join(COMMON_IMPORTS[name] for name in missing) + "\n" + code


RULES: list[tuple[str, Callable[[str], str]]] = [
    ("strip_fences", strip_fences),
    ("fix_indentation", fix_indentation),
    ("add_missing_imports", add_missing_imports),
    ("print_last_expression", print_last_expression),
]


def correct(code: str) -> Correction:
    """Apply every rule in order; a rule's change is kept only if it leaves code that
    compiles, or that did not compile before either (a later rule may still fix it).

    Code nested deeper than this process's compiler goes (`print(--…--1)`, a chain of
    `not` or `lambda:`, a few thousand levels: a few dozen tokens) makes `compile` and
    `ast.parse` raise RecursionError or MemoryError instead of SyntaxError; such code
    runs as given, and the sandbox's compiler reports the error to the model."""
    result = Correction(code)
    try:
        for name, rule in RULES:
            fixed = rule(result.code)
            if fixed == result.code:
                continue
            if compiles(fixed) or not compiles(result.code):
                result.code = fixed
                result.fixes.append(name)
    except (RecursionError, MemoryError):
        return Correction(code)
    return result


# ----------------------------------------------------------------------------- feedback

# The errors the paper answers with a cause and a fix (§2.2). NameError's text is the
# paper's, verbatim; the others follow its pattern.
GUIDANCE = {
    "NameError": (
        "This error is caused by using a module or a variable that is not defined, please "
        "check if you have imported all using Python code packages in your code, and you "
        "write complete code in your current tool calling."
    ),
    "IndexError": (
        "This error is caused by reading a position that a list, tuple or string does not "
        "have, please check the length of the sequence and the range of every index and "
        "loop bound in your code."
    ),
    "ValueError": (
        "This error is caused by passing a value that a function does not accept, please "
        "check the arguments against what the function expects (sign, range, type of "
        "number) and convert or validate them first."
    ),
    "TypeError": (
        "This error is caused by using an object of the wrong type or calling a function "
        "with the wrong arguments, please check the types of your variables and the "
        "signature of the function you call."
    ),
    "AttributeError": (
        "This error is caused by using an attribute or method that the object or module "
        "does not have, please check the name and the library's interface, or use the "
        "retrieval tool to look the function up."
    ),
    "ImportError": (
        "This error is caused by importing a module or name that does not exist, please "
        "use only sympy, scipy, numpy, math, cmath, fractions and itertools, and check "
        "the exact name of what you import."
    ),
}
GUIDANCE["ModuleNotFoundError"] = GUIDANCE["ImportError"]

_ANALYSIS_PROMPT = """\
This Python code failed.

Code:
{code}

Error:
{error}

In two to four sentences, say the most likely cause of the error and a concrete fix."""


class ModelCorrector:
    """Ask a model why the code failed and how to fix it (one greedy call per error).

    `serial`: tool calls come from many threads and a local model generates one call
    at a time; an HTTP endpoint (serial=False) batches concurrent requests itself.
    """

    def __init__(self, engine: Engine, max_tokens: int = 128, serial: bool = True) -> None:
        self.engine = engine
        self.max_tokens = max_tokens
        self._lock: AbstractContextManager = threading.Lock() if serial else nullcontext()

    def analyse(self, code: str, error: str) -> str:
        prompt = _ANALYSIS_PROMPT.format(code=code.strip(), error=error.strip())
        params = SamplingParams(max_tokens=self.max_tokens, temperature=0.0)
        with self._lock:
            [[completion]] = self.engine.generate([[{"role": "user", "content": prompt}]], params)
        return completion.text.strip()

    def close(self) -> None:
        self.engine.close()


def feedback(
    error_type: str | None, code: str, error: str, corrector: ModelCorrector | None
) -> str | None:
    """The cause and the fix to show after a failed run, for the paper's error types."""
    if error_type not in GUIDANCE:
        return None
    parts = [GUIDANCE[error_type]]
    if corrector is not None:
        analysis = corrector.analyse(code, error)
        if analysis:
            parts.append(analysis)
    return "\n".join(parts)


# ----------------------------------------------------------------------------- retrieval

# Errors that mostly come from calling a library wrongly (sympy.factorial(-1), a wrong
# keyword, a misspelt function): for these the paper asks the retrieval module (§2.2).
RETRIEVAL_ERRORS = (
    "ValueError",
    "TypeError",
    "AttributeError",
    "ImportError",
    "ModuleNotFoundError",
)
_DOTTED = re.compile(r"[A-Za-z_][\w.]*")
_CODE_FRAME = 'File "<code>"'


def retrieval_request(error_type: str | None, code: str, traceback: str) -> dict[str, Any] | None:
    """Arguments for the `retrieve` tool about the library call on the failing line,
    or None when the error is not one of those or that line calls no known library."""
    if error_type not in RETRIEVAL_ERRORS:
        return None
    function = _library_function(_failing_line(traceback), _imported_names(code))
    if function is None:
        return None
    error = traceback.strip().splitlines()[-1]
    query = f"How to use {function}? It failed with {error}"
    return {"repo_name": function.split(".")[0], "query": query}


def _failing_line(traceback: str) -> str:
    """The source line quoted under the traceback's last frame in the model's code."""
    lines = traceback.splitlines()
    frames = [i for i, line in enumerate(lines) if _CODE_FRAME in line and i + 1 < len(lines)]
    return lines[frames[-1] + 1].strip() if frames else ""


def _imported_names(code: str) -> dict[str, str]:
    """What each imported name stands for: `sp` -> sympy, `comb` -> math.comb."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, RecursionError, MemoryError):  # too deep: see `correct`
        return {}
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):  # `import numpy.linalg` binds numpy, not linalg
            for alias in node.names:
                root = alias.name.split(".")[0]
                names[alias.asname or root] = alias.name if alias.asname else root
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _library_function(line: str, names: dict[str, str]) -> str | None:
    """The first dotted name on `line` that belongs to a library the retriever indexes."""
    for dotted in _DOTTED.findall(line):
        root, _, rest = dotted.partition(".")
        full = names.get(root, root) + (f".{rest}" if rest else "")
        if full.split(".")[0] in REPOS:
            return full
    return None
