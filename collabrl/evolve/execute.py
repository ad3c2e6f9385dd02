"""Executable verification: a candidate's code is run again and its output checked.

AlphaApollo (§1, Figure 3): "the code is then executed and tested to yield verifiable,
fine-grained feedback". The reviews (`verify.py`) are model opinions; this check is
not. For each candidate with an answer:

1. its code: the `python` tool calls in its episode (apollo), else the fenced Python
   blocks of its solution (a model without tools writes them too);
2. every piece runs on its own through the python tool, in a fresh sandbox (the
   tool's rule: a call is self-contained), never in this process;
3. the last piece that runs cleanly and prints decides: its last printed line (or the
   last number on it) is compared with the answer by `is_equivalent`.

A candidate without code is checked where its solution writes the answer as the
value of an arithmetic expression (`12 * 7 = 84`): the sandbox evaluates the
expression. Verdicts: `verified` (the output agrees), `refuted` (it ran, printed, and
disagrees), `unverified` (no answer, nothing to run, or every run crashed, hit a
limit or printed nothing). Gold answers are never read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from collabrl.evolve.state import REFUTED, UNVERIFIED, VERIFIED, Candidate, CodeCheck
from collabrl.protocols.parsing import code_blocks
from collabrl.rewards.verify import is_equivalent
from collabrl.tools.python import NO_OUTPUT, PythonTool
from collabrl.tools.sandbox import Sandbox, SandboxLimits

# One line's `expression = value`: plain arithmetic on the left (a run of these
# characters holding a digit), a number (boxed or not) on the right. The run and the
# value are matched apart: one regex, `[…]*\d[…]*=`, retried the run from each of
# its characters, cubic in a line of digits (2,000 digits took 40 s).
_ARITHMETIC_RUN = re.compile(r"[-+*/^×÷().\d \t]+")
_DIGIT = re.compile(r"\d")
_VALUE = re.compile(r"=[ \t]*\$?(\\boxed\{[^{}]*\}|[-\d./]+)")
_OPERATOR = re.compile(r"\d\s*[-+*/^×÷]\s*[-(\d]")
_LATEX_OPERATORS = {r"\times": "*", r"\cdot": "*", r"\div": "/"}
# Output kept on the candidate: enough for a printed answer or a traceback's end; a
# run may print up to the sandbox's 64 KiB, which round files need not hold.
OUTPUT_CHARS = 2000
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_DECIMAL = re.compile(r"-?\d+\.(\d+)")


@dataclass(frozen=True)
class Piece:
    """Code to run, and where it came from: a tool call, a code block, an expression."""

    source: str
    code: str


def code_pieces(candidate: Candidate) -> list[Piece]:
    """What can be re-run of a candidate: its python tool calls, else its code blocks,
    else the arithmetic expression whose value its solution gives as the answer."""
    calls = [
        Piece("tool_call", code)
        for segment in candidate.episode.get("segments", [])
        if segment["author"] == "tool" and segment["meta"].get("tool") == "python"
        for code in [segment["meta"].get("arguments", {}).get("code")]
        if isinstance(code, str) and code.strip()
    ]
    if calls:
        return calls
    # An untagged block of prose is no Python: it crashes or prints nothing, and stays
    # unverified (it never refutes).
    blocks = [Piece("code_block", b) for b in code_blocks(candidate.completion)]
    if blocks or candidate.answer is None:
        return [b for b in blocks if b.code.strip()]
    expression = answer_expression(candidate.completion, candidate.answer)
    return [Piece("expression", f"print({expression})")] if expression else []


def answer_expression(text: str, answer: str) -> str | None:
    """The last arithmetic expression `text` equates to `answer`, as Python; None if none."""
    for old, new in _LATEX_OPERATORS.items():
        text = text.replace(old, new)
    found = None
    for left, right in equations(text):
        value = right.removeprefix("\\boxed{").removesuffix("}").rstrip(".")
        if _OPERATOR.search(left) and is_equivalent(value, answer):
            found = left.strip()
    if found is None:
        return None
    return found.replace("×", "*").replace("÷", "/").replace("^", "**")


def equations(text: str) -> Iterator[tuple[str, str]]:
    """Each `expression = value` in `text`, left to right, as (expression, value): the
    arithmetic run just before an `=` (from where the last value ended, if later) and
    the number after it. Linear in `text`: every run is read once."""
    resume = 0
    for run in _ARITHMETIC_RUN.finditer(text):
        left = text[max(run.start(), resume) : run.end()]
        value = _VALUE.match(text, run.end())
        if value is not None and _DIGIT.search(left):
            yield left, value.group(1)
            resume = value.end()


def agrees(output: str, answer: str) -> bool:
    """Whether printed `output` gives `answer`: its last line, or that line's last number."""
    last = output.strip().splitlines()[-1].strip()
    if is_equivalent(last, answer):
        return True
    numbers = _NUMBER.findall(last)
    return bool(numbers) and (is_equivalent(numbers[-1], answer) or rounds_to(numbers[-1], answer))


def rounds_to(printed: str, answer: str) -> bool:
    """Whether a printed number rounds to an answer written with fewer decimals: `1/3`
    prints 0.3333333333333333, which a solution rightly writes as 0.333."""
    written = _DECIMAL.fullmatch(answer.strip())
    if written is None:
        return False
    try:
        return round(float(printed), len(written.group(1))) == float(answer)
    except ValueError:  # a fraction such as 1/3: is_equivalent's case, not this one
        return False


def check_candidate(candidate: Candidate, tool: PythonTool) -> CodeCheck:
    """Run the candidate's code and compare; see the module docstring for the verdicts."""
    if candidate.answer is None:
        return CodeCheck(UNVERIFIED, None, "", "no answer to check")
    pieces = code_pieces(candidate)
    if not pieces:
        return CodeCheck(UNVERIFIED, None, "", "no code or arithmetic to run")
    failures: list[CodeCheck] = []
    for piece in reversed(pieces):  # the last piece that runs and prints decides
        result = tool.call({"code": piece.code})
        check = CodeCheck(UNVERIFIED, piece.source, piece.code, result.text[:OUTPUT_CHARS])
        if result.ok and result.text != NO_OUTPUT:
            verdict = VERIFIED if agrees(result.text, candidate.answer) else REFUTED
            return replace(check, verdict=verdict)
        failures.append(check)
    return failures[0]  # none decided: the last piece's failure, the final computation


def execution_tool(limits: SandboxLimits) -> PythonTool:
    """The python tool the checks run through: with the rule-based correction the
    proposals' tool applies (a tool call re-runs as it ran), without a correction model
    or retrieval (a re-run needs no advice)."""
    return PythonTool(Sandbox(limits))


def execute_checks(candidates: list[Candidate], tool: PythonTool) -> None:
    """Set every candidate's `code_check`; the sandbox runs go one per core."""
    with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="evolve-run") as pool:
        checks = list(pool.map(lambda c: check_candidate(c, tool), candidates))
    for candidate, check in zip(candidates, checks, strict=True):
        candidate.code_check = check
