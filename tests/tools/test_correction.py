"""Rule- and model-based error correction (AlphaApollo §2.2, appendix B.1).

Corrected code is executed in this process (it is code written here, not by a
model) so each rule is judged by what the code prints, not only by its text.
The model-based half runs a real tiny random Llama through `ModelCorrector`.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collabrl.engines.base import SamplingParams
from collabrl.tools.correction import (
    GUIDANCE,
    Correction,
    ModelCorrector,
    add_missing_imports,
    compiles,
    correct,
    feedback,
    fix_indentation,
    print_last_expression,
    retrieval_request,
    strip_fences,
)
from tests.linear_time import assert_linear
from tests.protocols.scripted import RecordingEngine


def output_of(code: str) -> str:
    """What `code` prints when run as a fresh module."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "<test>", "exec"), {"__name__": "__main__"})
    return buffer.getvalue()


# ----------------------------------------------------------------- appendix B.1 cases

# Case 1: the model wrapped its code in a markdown block (the paper's extraction
# lost the f-string braces; they are restored here).
PAPER_FENCED = """```python
number = 2024
binary_str = bin(number)[2:]
print(f"Binary representation of {number}: {binary_str}")
positions = [i for i, bit in enumerate(reversed(binary_str)) if bit == '1']
print(f"Positions with 1s (from right, starting at 0): {positions}")
```
"""
PAPER_FENCED_OUTPUT = (
    "Binary representation of 2024: 11111101000\n"
    "Positions with 1s (from right, starting at 0): [3, 5, 6, 7, 8, 9, 10]\n"
)

# Case 2: "IndentationError: unexpected indent" on the second line; `sp` is also
# never imported in the paper's snippet.
PAPER_INDENT = """y = sp.symbols('y')
    equation = y**3 - 27*y + 46
roots = sp.solve(equation, y)
print(roots)
"""

# Case 3: "NameError: name 'math' is not defined" (Fraction is not imported either,
# and c6_3 is never defined: a mistake no rule can guess the fix of).
PAPER_COMB = """# calculate combinations
c0_4 = math.comb(4, 4)
c1_4 = math.comb(4, 3)
c2_4 = math.comb(4, 2)
c3_4 = math.comb(4, 1)
# Compute probabilities using exact fractions
P_A = Fraction(c1_4, c0_4 + c1_4 + c2_4 + c3_4)
numerator_B = c0_4 + c1_4 * c6_3
P_B = Fraction((numerator_B), c0_4)
conditional_prob = P_A / P_B
"""

# Case 4: the answer left as a bare last expression, which a script never shows.
PAPER_BARE = """x, y = sp.symbols('x y')
ab_eq = sp.Eq(y, -sp.sqrt(3)*x + sp.sqrt(3)/2)
envelope_eq = sp.Eq(x**(2/3) + y**(2/3), 1)
substituted_eq = envelope_eq.subs(y, ab_eq.rhs)
solution = sp.solve(substituted_eq, x)
solution
"""


def test_paper_fenced_code_is_extracted_and_runs():
    assert not compiles(PAPER_FENCED)
    fixed = correct(PAPER_FENCED)
    assert fixed.fixes == ["strip_fences"]
    assert "```" not in fixed.code
    assert output_of(fixed.code) == PAPER_FENCED_OUTPUT


def test_paper_unexpected_indent_is_fixed_and_sympy_imported():
    with pytest.raises(IndentationError, match="unexpected indent"):
        compile(PAPER_INDENT, "<code>", "exec")
    fixed = correct(PAPER_INDENT)
    assert fixed.fixes == ["fix_indentation", "add_missing_imports"]
    assert "\nequation = y**3 - 27*y + 46\n" in fixed.code
    assert fixed.code.startswith("import sympy as sp\n")
    assert output_of(fixed.code) == "[2, -1 + 2*sqrt(6), -2*sqrt(6) - 1]\n"


def test_paper_missing_math_import_is_added_and_only_the_real_mistake_remains():
    with pytest.raises(NameError, match="'math'"):
        output_of(PAPER_COMB)
    fixed = correct(PAPER_COMB)
    assert fixed.fixes == ["add_missing_imports"]
    head = fixed.code.splitlines()[:2]
    assert head == ["from fractions import Fraction", "import math"]
    # Past the imports, the code now fails where the model really erred.
    with pytest.raises(NameError, match="'c6_3'"):
        output_of(fixed.code)


def test_paper_bare_last_expression_is_printed():
    fixed = print_last_expression(PAPER_BARE)
    assert fixed.splitlines()[:-5] == PAPER_BARE.splitlines()[:-1]
    assert fixed.splitlines()[-5:] == [
        "__value = (",
        "solution",  # on its own line: a traceback quotes it as the model wrote it
        ")",
        "if __value is not None:",
        "    print(__value)",
    ]
    assert compiles(fixed)
    # The same shape on a problem sympy can solve, run for real.
    code = "import sympy as sp\nx = sp.symbols('x')\nsolution = sp.solve(x**2 - 4, x)\nsolution\n"
    assert correct(code).fixes == ["print_last_expression"]
    assert output_of(correct(code).code) == "[-2, 2]\n"


# ----------------------------------------------------------------- strip_fences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```py\nprint(1)\n```", "print(1)\n"),
        ("```python3\nprint(1)\n```", "print(1)\n"),
        ("```\nprint(1)\n```", "print(1)\n"),
        # Prose around the block is dropped; only the code is kept.
        ("Here is the code:\n```python\nprint(1)\n```\nIt prints 1.", "print(1)\n"),
        # Two blocks run as one script, in order.
        ("```python\nx = 2\n```\nthen\n```python\nprint(x)\n```", "x = 2\nprint(x)\n"),
        # A block the model never closed.
        ("```python\nprint(1)\n", "print(1)\n"),
        ("```Python\nprint(1)\n```\n", "print(1)\n"),
        # Stray fence lines that open no block are dropped.
        ("print(1)\n```", "print(1)\n"),
    ],
)
def test_strip_fences(text, expected):
    assert strip_fences(text) == expected
    assert output_of(strip_fences(text)).strip().endswith(("1", "2"))


def test_strip_fences_keeps_code_under_another_language_tag():
    assert strip_fences("```text\nprint(1)\n```\n") == "print(1)\n"


# The header's two blank runs could split a line of blanks in quadratically many ways
# before the missing newline failed: a python tool call of "```" and 64k spaces stalled
# the tool's caller (an MCP client with it) for seconds.
@pytest.mark.parametrize("blanks", [" ", "\t", " \t"], ids=["spaces", "tabs", "mixed"])
def test_strip_fences_is_linear_on_a_fence_line_of_blanks(blanks):
    hostile = ("```" + blanks * 65_536)[:65_536]
    benign = ("```python\n" + "x = 1\nprint(x + 2)\n" * 6_554)[: len(hostile) - 3] + "```"
    assert_linear(strip_fences, hostile, benign)
    assert strip_fences(hostile) == ""


# The backtracking pattern strip_fences used before, as an oracle on short inputs.
_BACKTRACKING_FENCE = re.compile(r"```[ \t]*[\w.+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(["```", "`", "py", "x+1", " ", "\t", "\n", "."]), max_size=16))
def test_strip_fences_reads_the_blocks_the_backtracking_pattern_read(pieces):
    text = "".join(pieces)
    blocks = _BACKTRACKING_FENCE.findall(text)
    if blocks and not compiles(text):
        assert strip_fences(text) == "\n".join(b.strip("\n") for b in blocks) + "\n"


def test_strip_fences_leaves_unfenced_code_exactly_as_given():
    for code in ["print(1)\n", "print(1)", "x = 1\n\n\nprint(x)\n", "print(1)\r\n"]:
        assert strip_fences(code) == code


# ----------------------------------------------------------------- fix_indentation


@pytest.mark.parametrize(
    ("broken", "output"),
    [
        # Unexpected indent: the line takes the previous line's indent.
        ("x = 1\n  y = 2\nprint(x + y)\n", "3\n"),
        # A block whose body lost its indent gets one level.
        ("for i in range(3):\nprint(i)\n", "0\n1\n2\n"),
        ("def f(a):\nreturn a * 2\nprint(f(4))\n", "8\n"),
        # An unindent that matches no level takes the nearest outer one.
        ("if True:\n        x = 1\n    y = 2\nprint(x, y)\n", "1 2\n"),
        # Everything indented (copied out of a function): dedented.
        ("    a = 5\n    print(a)\n", "5\n"),
    ],
)
def test_fix_indentation(broken, output):
    assert not compiles(broken)
    fixed = fix_indentation(broken)
    assert output_of(fixed) == output
    assert correct(broken).fixes[:1] == ["fix_indentation"]


def test_fix_indentation_keeps_valid_code_byte_for_byte():
    # Whitespace-only lines inside a string are data; dedenting would blank them.
    code = 's = """a\n   \nb"""\nprint(repr(s))\n'
    assert fix_indentation(code) == code
    assert output_of(correct(code).code) == "'a\\n   \\nb'\n"


def test_fix_indentation_gives_up_on_a_non_indentation_syntax_error():
    broken = "x = (1,\n  y = 2\n"
    assert fix_indentation(broken) == broken
    assert correct(broken).code == broken  # nothing compiles, nothing is claimed fixed


# ----------------------------------------------------------------- add_missing_imports


@pytest.mark.parametrize(
    ("code", "imports", "output"),
    [
        ("print(math.comb(5, 2))", ["import math"], "10\n"),
        ("print(comb(5, 2))", ["from math import comb"], "10\n"),
        ("print(np.arange(4).sum())", ["import numpy as np"], "6\n"),
        (
            "print(Fraction(1, 3) + isqrt(4))",
            ["from fractions import Fraction", "from math import isqrt"],
            "7/3\n",
        ),
        ("print(len(list(permutations(range(3)))))", ["from itertools import permutations"], "6\n"),
    ],
)
def test_add_missing_imports(code, imports, output):
    fixed = add_missing_imports(code)
    assert fixed.splitlines()[: len(imports)] == imports
    assert output_of(fixed) == output


@pytest.mark.parametrize(
    "code",
    [
        "import math\nprint(math.pi)",
        "import numpy as np\nprint(np.pi)",
        "from math import *\nprint(comb(4, 2))",  # a star import may bind anything
        "product = 1\nfor k in (2, 3):\n    product *= k\nprint(product)",
        "def sqrt(v):\n    return v\nprint(sqrt(9))",
        "def f(gcd):\n    return gcd\nprint(f(2))",
        "print([factorial for factorial in range(2)])",
        "class solve:\n    pass\nprint(solve.__name__)",
        "try:\n    1 / 0\nexcept ZeroDivisionError as gcd:\n    print(gcd)",
        "print(unknown_name)",  # not a common module name: left for the run to report
    ],
)
def test_add_missing_imports_leaves_bound_or_unknown_names_alone(code):
    assert add_missing_imports(code) == code


# ----------------------------------------------------------------- print_last_expression


@pytest.mark.parametrize(
    ("code", "output"),
    [
        ("x = 6\nx * 7", "42\n"),
        ("x = 6\nx * 7\n", "42\n"),
        ("[\n    1,\n    2,\n]", "[1, 2]\n"),
        ("'text'", "text\n"),
        # None is silent, as in a notebook: a call made for its effect prints nothing more.
        ("def show():\n    print('shown')\nshow()", "shown\n"),
        ("None", ""),
        # A trailing comment after the expression does not break the rewrite.
        ("x = 3\nx  # the answer", "3\n"),
    ],
)
def test_print_last_expression(code, output):
    assert output_of(print_last_expression(code)) == output


@pytest.mark.parametrize(
    "code",
    [
        "print(1)",
        "x = 1",
        "for i in range(2):\n    i",
        "",
        "def f():\n    return 1",
        "x = (",  # does not parse: left to the other rules and the run
    ],
)
def test_print_last_expression_leaves_other_endings_alone(code):
    assert print_last_expression(code) == code


def test_print_last_expression_keeps_statements_before_a_semicolon():
    assert output_of(correct("a = 1; a").code) == "1\n"
    assert output_of(correct("import math; math.floor(2.5)").code) == "2\n"
    assert output_of(correct("s = 'é'; len(s)").code) == "1\n"  # bytes, not characters


# ----------------------------------------------------------------- correct()

VALID_PROGRAMS = [
    "total = 0\nfor i in range(5):\n    total += i\nprint(total)\n",
    "while True:\n    break\nprint('done')",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))\n",
    "class Point:\n    def __init__(self, x):\n        self.x = x\n\nprint(Point(3).x)\n",
    "from math import *\nprint(comb(6, 3), floor(pi))\n",
    "from itertools import *\nprint(list(product('ab', repeat=2)))\n",
    "import math\nprint(math.factorial(5))\nprint('two lines')\n",
    "x = 2\nprint(x ** 10)",
    "values = [1, 2, 3]\nprint(sum(values))  # already prints\n",
    "print('a')\n\n\n",
    "try:\n    1 / 0\nexcept ZeroDivisionError as err:\n    print(type(err).__name__)\n",
    # A fence inside a string literal is data: the program compiles, so it is kept.
    "s = '''\n```python\nx\n```\n'''\nprint(len(s))\n",
    'doc = """keep\n    \nthis"""\nprint(doc)\n',
    "if True:\n\tprint('tab')\n",
]


@pytest.mark.parametrize("code", VALID_PROGRAMS)
def test_correct_never_makes_valid_code_worse(code):
    fixed = correct(code)
    # Valid programs that already show their result need no rule at all.
    assert fixed.code == code
    assert fixed.fixes == []


@pytest.mark.parametrize(
    ("code", "output"),
    [
        ("def noop():\n    print('side effect')\n    return None\n\nnoop()\n", "side effect\n"),
        ("result = None\nresult\n", ""),
        ("print('x') or None", "x\n"),
    ],
)
def test_correct_keeps_output_of_none_valued_last_expressions(code, output):
    # These get the print wrapper, but a None value stays silent, so nothing changes.
    fixed = correct(code)
    assert fixed.fixes == ["print_last_expression"]
    assert output_of(code) == output_of(fixed.code) == output


def test_correct_applies_rules_in_order_and_the_result_runs():
    messy = "Sure:\n```python\nfor k in range(3):\nprint(math.factorial(k))\nk + 10\n```\n"
    fixed = correct(messy)
    assert fixed.fixes == [
        "strip_fences",
        "fix_indentation",
        "add_missing_imports",
        "print_last_expression",
    ]
    assert output_of(fixed.code) == "1\n1\n2\n12\n"


def test_correct_keeps_a_change_only_if_it_compiles():
    # The import cannot go above `from __future__`; the original compiled, so it stays.
    code = "from __future__ import annotations\nprint(math.pi)\n"
    assert correct(code) == correct(code).__class__(code, [])


# Small valid programs: assignments of integer expressions over names defined so far,
# optionally a loop, then either a print or a bare expression as the last line.
_names = st.sampled_from(["a", "b", "c", "total", "value"])


@st.composite
def small_programs(draw: st.DrawFn) -> str:
    defined = ["n0"]
    lines = [f"n0 = {draw(st.integers(-50, 50))}"]
    for _ in range(draw(st.integers(0, 4))):
        name = draw(_names)
        left, right = draw(st.sampled_from(defined)), draw(st.sampled_from(defined))
        op = draw(st.sampled_from(["+", "-", "*", "//", "%"]))
        right = f"({right} or 1)" if op in ("//", "%") else right
        if draw(st.booleans()):
            lines += [
                f"for _ in range({draw(st.integers(0, 3))}):",
                f"    {name} = {left} {op} {right}",
            ]
            lines.insert(len(lines) - 2, f"{name} = 0")
        else:
            lines.append(f"{name} = {left} {op} {right}")
        defined.append(name)
    shown = draw(st.sampled_from(defined))
    lines.append(draw(st.sampled_from([f"print({shown})", shown, f"[{shown}]"])))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


@settings(max_examples=150, deadline=None)
@given(small_programs())
def test_correct_preserves_output_of_generated_valid_programs(code):
    assert compiles(code)
    fixed = correct(code)
    assert compiles(fixed.code)
    # The only change a valid program may get is having its last value shown.
    assert fixed.fixes in ([], ["print_last_expression"])
    before, after = output_of(code), output_of(fixed.code)
    assert after.startswith(before)
    if not fixed.fixes:
        assert fixed.code == code


# ----------------------------------------------------------------- feedback


@pytest.mark.parametrize(
    "error_type",
    [
        "NameError",
        "IndexError",
        "ValueError",
        "TypeError",
        "AttributeError",
        "ImportError",
        "ModuleNotFoundError",
    ],
)
def test_feedback_gives_guidance_for_the_papers_error_types(error_type):
    note = feedback(error_type, "x", "Traceback ...", None)
    assert note == GUIDANCE[error_type]
    assert note.startswith("This error is caused by")


def test_name_error_guidance_is_the_papers_sentence():
    assert feedback("NameError", "print(x)", "NameError: name 'x' is not defined", None) == (
        "This error is caused by using a module or a variable that is not defined, please "
        "check if you have imported all using Python code packages in your code, and you "
        "write complete code in your current tool calling."
    )
    assert GUIDANCE["ModuleNotFoundError"] == GUIDANCE["ImportError"]


@pytest.mark.parametrize(
    "error_type",
    [None, "ZeroDivisionError", "SyntaxError", "KeyError", "wall_time", "cpu_time", "memory"],
)
def test_feedback_is_none_for_other_errors(error_type):
    assert feedback(error_type, "1 / 0", "ZeroDivisionError: division by zero", None) is None


# ----------------------------------------------------------------- ModelCorrector

FAILED_CODE = "values = [1, 2, 3]\nprint(values[undefined_index])"
FAILED_ERROR = (
    "Traceback (most recent call last):\nNameError: name 'undefined_index' is not defined"
)


def test_model_corrector_sends_code_and_error_and_appends_the_models_text(tiny_engine):
    recording = RecordingEngine(tiny_engine)
    corrector = ModelCorrector(recording, max_tokens=12)

    note = feedback("NameError", FAILED_CODE, FAILED_ERROR, corrector)

    [prompt] = recording.prompts
    [message] = prompt
    assert message["role"] == "user"
    assert FAILED_CODE in message["content"] and FAILED_ERROR in message["content"]
    # The same greedy call made directly: the analysis is that text, after the guidance.
    params = SamplingParams(max_tokens=12, temperature=0.0)
    [[direct]] = tiny_engine.generate([prompt], params)
    analysis = direct.text.strip()
    assert analysis
    assert note == GUIDANCE["NameError"] + "\n" + analysis


def test_model_corrector_is_not_asked_about_other_errors(tiny_engine):
    recording = RecordingEngine(tiny_engine)
    corrector = ModelCorrector(recording, max_tokens=4)
    assert feedback("ZeroDivisionError", "1 / 0", "ZeroDivisionError", corrector) is None
    assert feedback("wall_time", "while True: pass", "", corrector) is None
    assert recording.prompts == []


class ParamsRecorder(RecordingEngine):
    """Also keeps the sampling parameters of every call."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.params: list[SamplingParams] = []

    def generate(self, prompts, params):
        self.params.append(params)
        return super().generate(prompts, params)


def test_model_corrector_asks_one_greedy_call_of_max_tokens(tiny_engine):
    recorder = ParamsRecorder(tiny_engine)
    corrector = ModelCorrector(recorder, max_tokens=3)
    first = corrector.analyse(FAILED_CODE, FAILED_ERROR)
    second = corrector.analyse(FAILED_CODE, FAILED_ERROR)
    assert [(p.max_tokens, p.temperature, p.n) for p in recorder.params] == [(3, 0.0, 1)] * 2
    assert first == second  # greedy: the same note for the same failure
    # Code and error arrive stripped of surrounding blank lines.
    corrector.analyse("\n\n" + FAILED_CODE + "\n\n", "\n" + FAILED_ERROR + "\n")
    assert recorder.prompts[-1] == recorder.prompts[0]


# ----------------------------------------------------------------- retrieval_request


def traceback_of(line: str, error: str) -> str:
    """A traceback as the sandbox prints it, failing on `line` of the model's code."""
    return (
        "Traceback (most recent call last):\n"
        '  File "<code>", line 2, in <module>\n'
        f"    {line}\n"
        '  File "/venv/lib/python3.11/site-packages/sympy/core/function.py", line 9, in f\n'
        "    raise ValueError(message)\n"
        f"{error}"
    )


@pytest.mark.parametrize(
    ("code", "line", "error", "repo", "function"),
    [
        (
            "import math\nprint(math.comb(-1, 2))",
            "print(math.comb(-1, 2))",
            "ValueError: n must be a non-negative integer",
            "math",
            "math.comb",
        ),
        # An alias resolves to the module: `sp` is sympy.
        (
            "import sympy as sp\nsp.factorial(x, 2)",
            "sp.factorial(x, 2)",
            "TypeError: factorial takes 1 positional argument",
            "sympy",
            "sympy.factorial",
        ),
        # A name imported from a module resolves to its full name.
        (
            "from fractions import Fraction\nFraction(1.5, 2)",
            "Fraction(1.5, 2)",
            "TypeError: both arguments should be Rational instances",
            "fractions",
            "fractions.Fraction",
        ),
        (
            "import numpy as np\nnp.linalg.solv([[1]], [1])",
            "np.linalg.solv([[1]], [1])",
            "AttributeError: module 'numpy.linalg' has no attribute 'solv'",
            "numpy",
            "numpy.linalg.solv",
        ),
        # `import numpy.linalg` binds numpy itself.
        (
            "import numpy.linalg\nnumpy.array([1], dtype='x')",
            "numpy.array([1], dtype='x')",
            "TypeError: data type 'x' not understood",
            "numpy",
            "numpy.array",
        ),
        # The import itself failed: the library is named on the line as it is.
        (
            "from sympy import factorials",
            "from sympy import factorials",
            "ImportError: cannot import name 'factorials' from 'sympy'",
            "sympy",
            "sympy",
        ),
    ],
)
def test_retrieval_request_names_the_library_call_on_the_failing_line(
    code, line, error, repo, function
):
    error_type = error.split(":")[0]
    request = retrieval_request(error_type, code, traceback_of(line, error))
    assert request == {"repo_name": repo, "query": f"How to use {function}? It failed with {error}"}


@pytest.mark.parametrize(
    ("error_type", "code", "line"),
    [
        # Not one of the errors the paper sends to retrieval.
        ("NameError", "import math\nmath.comb(n, 2)", "math.comb(n, 2)"),
        ("ZeroDivisionError", "import math\nmath.comb(1, 0) / 0", "math.comb(1, 0) / 0"),
        (None, "import math", "math.pi"),
        # The failing line calls no library the retriever indexes.
        ("ValueError", "def f(x):\n    return int(x)\nf('a')", "f('a')"),
        ("ImportError", "import networkx", "import networkx"),
    ],
)
def test_retrieval_request_is_none_without_an_indexed_library_error(error_type, code, line):
    assert retrieval_request(error_type, code, traceback_of(line, "Error: x")) is None


def test_retrieval_request_is_none_without_a_frame_of_the_models_code():
    error = "ValueError: n must be a non-negative integer"
    assert retrieval_request("ValueError", "import math", error) is None


@pytest.mark.parametrize(
    "code",
    ["print(" + "-" * 10_000 + "1)", "print(" + "not " * 10_000 + "1)", "lambda: " * 10_000 + "1"],
    ids=["unary", "not", "lambda"],
)
def test_code_too_deep_for_the_compiler_is_left_as_given(code):
    # compile() and ast.parse raise RecursionError/MemoryError here, not SyntaxError.
    assert correct(code) == Correction(code)
    assert retrieval_request("TypeError", code, 'File "<code>", line 1\n    x\n') is None
