"""Answer checking of Minerva's answer line, matrices, tuples, sets and intervals, against
cases taken from public graders' test suites (short answer strings only, no code).

Every case is (prediction, gold, expected), the order of `is_equivalent(pred, gold)`.
The Minerva cases' prediction is a whole completion: its answer is read by the relay
template's extractors (boxed, then the answer line), as `collab eval` reads it.
"""

from __future__ import annotations

import pytest

from collabrl.data.prompts import get_prompt
from collabrl.rewards.extract import extract_answer
from collabrl.rewards.verify import is_equivalent

FINAL = "Final Answer: The final answer is"
HOPE = "I hope it is correct."

# Minerva (Lewkowycz et al. 2022) as lm-eval-harness runs it: the answer lines of the
# few-shot prompt in lm_eval/tasks/minerva_math/utils.py, which `get_unnormalized_answer`
# reads between "Final Answer: The final answer is" and ". I hope it is correct.".
MINERVA_LM_EVAL = [
    (f"{FINAL} $[2,5)$. {HOPE}", "[2,5)", True),
    (f"{FINAL} $24$. {HOPE}", "24", True),
    (f"{FINAL} $16$. {HOPE}", "16", True),
    (f"{FINAL} $-\\frac{{2}}{{3}}$. {HOPE}", "-\\frac{2}{3}", True),
    # ... the same lines with a wrong answer, an interval's other brackets included.
    (f"{FINAL} $25$. {HOPE}", "24", False),
    (f"{FINAL} $(2,5]$. {HOPE}", "[2,5)", False),
    (f"{FINAL} $\\frac{{2}}{{3}}$. {HOPE}", "-\\frac{2}{3}", False),
]

# The same answer line as models write it: without `Final Answer:`, without `$…$`, without
# the sign-off, with `x =` (Minerva's normalization keeps what follows the last `=`).
MINERVA_VARIANTS = [
    (f"The final answer is $24$. {HOPE}", "24", True),
    (f"{FINAL} 24. {HOPE}", "24", True),
    (f"The final answer is 3.5. {HOPE}", "3.5", True),
    (f"The final answer is 3.5. {HOPE}", "35", False),
    (f"{FINAL} $24$.", "24", True),
    (f"{FINAL} $x = 5$. {HOPE}", "5", True),
    ("Solution: ...\nthe final answer is: $\\frac{1}{2}$", "0.5", True),
    (f"So $\\boxed{{7}}$.\n{FINAL} $7$. {HOPE}", "7", True),
]

# math-verify (huggingface/Math-Verify, tests/test_all.py): Minerva-style completions in its
# extraction cases, one with text after the sign-off.
MINERVA_MATH_VERIFY = [
    (
        f"The solution is \\( x \\in (-6, 10) \\). {FINAL} \\((-6, 10)\\). {HOPE}",
        "(-6, 10)",
        True,
    ),
    (f"{FINAL} $28 \\%$. {HOPE} Note: The solution provided is incorrect.", "28\\%", True),
]

# Matrices compare entry by entry; a `vmatrix` is a determinant, a number.
# From math-verify's tests/test_all.py (test_matrix_extraction, and the cases it ports from
# the Qwen2.5-Math grader) and Qwen2.5-Math evaluation/grader.py's own unit tests.
MATRICES_PUBLIC = [
    (
        r"\begin{pmatrix}1 & 0 \\ 0 & 1\end{pmatrix}",
        r"\begin{pmatrix}1 & 0 \\ 0 & 1\end{pmatrix}",
        True,
    ),
    (
        r"\begin{pmatrix}0 & 0 \\0 & 0\end{pmatrix}",
        r"\begin{bmatrix}0 & 0 \\0 & 0\end{bmatrix}",
        True,
    ),
    (
        r"\left[\begin{array}{cc}1 & 2 \\3 & 4\end{array}\right]",
        r"\begin{pmatrix}1 & 2 \\3 & 4\end{pmatrix}",
        True,
    ),
    (
        r"\begin{pmatrix}\frac{1}{2} & \frac{3}{4} \\ \frac{5}{6} & \frac{7}{8}\end{pmatrix}",
        r"\begin{pmatrix}\frac{1}{2} & \frac{3}{4} \\ \frac{5}{6} & \frac{7}{8}\end{pmatrix}",
        True,
    ),
    (
        r"\begin{pmatrix}1 & 2 \\ 3 & 5\end{pmatrix}",
        r"\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix}",
        False,
    ),
    (
        r"\begin{pmatrix}-\frac{7}{4}&-2\\4&\frac{1}{4}\\\end{pmatrix}",
        r"\begin{pmatrix}-\frac{7}{4}&-2\\4&\frac{1}{4}\\\end{pmatrix}",
        True,
    ),
    (
        r"\begin{pmatrix}\frac{1}{3x^{2/3}}&0&0\\0&1&0\\-\sin(x)&0&0\end{pmatrix}",
        r"\begin{pmatrix}\frac{1}{3\sqrt[3]{x}^2}&0&0\\0&1&0\\-\sin(x)&0&0\\\end{pmatrix}",
        True,
    ),
    (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", True),
    (r"\begin{pmatrix}1&2\\3&5\end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", False),
]

# What issue 24 asks of matrices: the environment does not matter, entries and shape do.
MATRICES_OURS = [
    (
        r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}",
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        True,
    ),
    (
        r"\begin{matrix} 1 & 2 \\ 3 & 4 \end{matrix}",
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        True,
    ),
    (
        r"\begin{pmatrix} 1 & 3 \\ 2 & 4 \end{pmatrix}",  # the transpose
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        False,
    ),
    (
        r"\begin{pmatrix} 1 & 2 & 3 & 4 \end{pmatrix}",
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        False,
    ),
    (r"\begin{pmatrix} 1 & 2 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", False),
    # A row break followed by a space once lost its second backslash to the `\ ` macro.
    (
        r"\begin{pmatrix} \frac{1}{2} \\ 2 \end{pmatrix}",
        r"\begin{pmatrix} 1/2 \\ 2 \end{pmatrix}",
        True,
    ),
    (
        r"\begin{pmatrix} 0.5 \\ -2 \end{pmatrix}",
        r"\begin{pmatrix} \dfrac{1}{2} \\ -2 \end{pmatrix}",
        True,
    ),
    (
        r"\begin{pmatrix} 0.5 \\ 2 \end{pmatrix}",
        r"\begin{pmatrix} \dfrac{1}{2} \\ -2 \end{pmatrix}",
        False,
    ),
    (r"-2", r"\begin{vmatrix} 1 & 2 \\ 3 & 4 \end{vmatrix}", True),
    (
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        r"\begin{vmatrix} 1 & 2 \\ 3 & 4 \end{vmatrix}",
        False,
    ),
]

# math-verify's test_all.py (notations and the Qwen2.5-Math cases it ports) and Qwen2.5-Math
# evaluation/grader.py's unit tests: tuples, sets and intervals.
TUPLES_SETS_INTERVALS_PUBLIC = [
    ("(6,31,-1)", "(6,31,-1)", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \frac{\pi}{2})", True),
    (r"\{1\pm\sqrt{5},-2\}", r"\{1\pm\sqrt{5},-2\}", True),
    (
        r"[-1, -\tfrac12) \cup (-\tfrac12, 0) \cup (0, 1) \cup (1, \infty)",
        r"[-1, -\frac{1}{2}) \cup (-\frac{1}{2}, 0) \cup (0, 1) \cup (1, \infty)",
        True,
    ),
    (r"\{-1\} \cup [0,7)", r"\{-1\} \cup [0,7)", True),
    (r"(2,12) \cup (12,102)", r"(2, 12) \cup (12, 102)", True),
    ("[-4, 0]", "[-4,0]", True),
    ("[1, 2, 3]", "[1, 2, 3]", True),
    ("[1, 2, 4]", "[1, 2, 3]", False),
    ("(1, 2, 3)", "(1, 2, 3)", True),
]

# The PRM800K grader's rules (openai/prm800k, prm800k/grading/grader.py: `split_tuple` and
# `grade_answer` compare a tuple's or interval's elements in order and need the same
# brackets); it ships no test file, so these cases state those rules. Sets ignore order.
TUPLES_SETS_INTERVALS_RULES = [
    ("(2, 1)", "(1, 2)", False),
    ("(1,2)", "(1, 2)", True),
    ("(-1, 3)", "(3, -1)", False),
    ("(4, 3)", "(5, 2)", False),  # two descending pairs: not two empty intervals
    ("(3, 2, 1)", "(1, 2, 3)", False),
    (r"(-\frac{1}{2}, 1)", r"(1, -\frac{1}{2})", False),
    (r"(2, 0.5)", r"\left(2, \frac{1}{2}\right)", True),
    ("[1,2)", "(1,2]", False),
    ("(1,2]", "(1,2]", True),
    ("(1,2]", "(1,2)", False),
    ("[5, 2]", "[2, 5]", False),
    (r"(-\infty,0)\cup(1,\infty)", r"(-\infty, 0] \cup (1, \infty)", False),
    (r"\{2, 1\}", r"\{1, 2\}", True),
    (r"\{3, 1, 2\}", r"\{1, 2, 3\}", True),
    (r"\{1, 3\}", r"\{1, 2\}", False),
]

# Where a public test passes only with a looser tolerance than ours. math-verify's tests
# pass precision=2 for these (Qwen2.5-Math compares with rel_tol 1e-4); we compare numbers to
# math-verify's default 6 digits, so a rounded entry or end point is wrong.
ROUNDED_DEVIATIONS = [
    (
        r"\begin{pmatrix}0.33\\0.2 \end{pmatrix}",
        r"(\begin{pmatrix}\frac{1}{3}\\ \frac{1}{5} \end{pmatrix})",
        False,
    ),
    ("(0.6,2.6667]", r"(\frac{3}{5},\frac{8}{3}]", False),
]

MINERVA = MINERVA_LM_EVAL + MINERVA_VARIANTS + MINERVA_MATH_VERIFY
ANSWERS = (
    MATRICES_PUBLIC
    + MATRICES_OURS
    + TUPLES_SETS_INTERVALS_PUBLIC
    + TUPLES_SETS_INTERVALS_RULES
    + ROUNDED_DEVIATIONS
)


@pytest.mark.parametrize(("completion", "gold", "expected"), MINERVA)
def test_minerva_answer_line(completion: str, gold: str, expected: bool) -> None:
    answer = extract_answer(completion, get_prompt("relay").extract)
    assert answer is not None
    assert is_equivalent(answer, gold) is expected


@pytest.mark.parametrize(("pred", "gold", "expected"), ANSWERS)
def test_structured_answer(pred: str, gold: str, expected: bool) -> None:
    assert is_equivalent(pred, gold) is expected


@pytest.mark.parametrize(("pred", "gold", "expected"), ANSWERS)
def test_structured_answer_boxed_in_a_completion(pred: str, gold: str, expected: bool) -> None:
    """The same verdict when the answer is read back out of a boxed completion."""
    answer = extract_answer(f"So the answer is $\\boxed{{{pred}}}$.", get_prompt("relay").extract)
    assert answer == pred
    assert is_equivalent(answer, gold) is expected
