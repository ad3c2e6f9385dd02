"""Pull the final answer out of a model completion.

Three extractors, each `str -> str | None`, tried in a caller-chosen order by
`extract_answer`:

- `boxed`: the last `\\boxed{...}` / `\\fbox{...}` (MATH-style prompts),
- `answer_line`: the text after the last `Answer:` line (EAPO-style prompts) or
  Minerva's `The final answer is $…$. I hope it is correct.`,
- `last_number`: the last number in the text (GSM8K fallback).

`boxed` and `answer_line` read the answer format a prompt asks for (lm-eval's
"strict-match"); `last_number` finds an answer in any text, asked for or not (lm-eval's
"flexible-extract"), so `extract_answer_by` says which extractor answered (see
`rewards.score` for what each grading credits).

Completions are arbitrary model output, so none of these may ever raise: a
malformed completion simply has no answer (None).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

# A box macro, not followed by a letter so that e.g. `\boxedsomething` is not a box.
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# The argument of `\boxed 5` (brace-less form): one token, ending at a space or `$`.
_BARE_TOKEN_RE = re.compile(r"[^\s$]+")
# `Answer:`, `**Answer:**`, `**Answer**:`, `Final Answer:` (the `Final` needs no special case),
# and Minerva's `The final answer is $…$` (with or without its `Final Answer:` in front).
_ANSWER_RE = re.compile(
    r"\banswer\b(?:\s*\*\*)?\s*:(?:\s*\*\*)?|\bfinal answer is\b\s*:?", re.IGNORECASE
)
# Minerva's sign-off after its answer, and whatever follows it on the line: lm-eval's
# `minerva_math` reads the answer up to it.
_HOPE_RE = re.compile(r"\.?\s*I hope it is correct\b.*", re.IGNORECASE)
# An answer line opening with inline math: its first `$…$` (or `$$…$$`) is the answer,
# whatever prose follows (`$5$, as shown`); `\$` inside is a dollar sign, not the end.
_LEADING_MATH_RE = re.compile(r"\$\$?((?:\\.|[^$\\])+)\$")
# A number: thousands with commas first (so `1,234` is one number), then plain ints/decimals.
# The minus sign only counts when it is not a binary minus (`3-5` ends in 5, not -5).
_NUMBER_RE = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")


def _nonempty(text: str | None) -> str | None:
    """Strip `text`; an empty answer is no answer."""
    if text is None:
        return None
    text = text.strip()
    return text or None


def _match_braces(text: str, open_at: int) -> int | None:
    """Index of the `}` closing the `{` at `open_at`, or None if it never closes."""
    depth = 0
    i = open_at
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            # Skip the escaped character: `\{` and `\}` are literal braces, not grouping.
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _box_argument(text: str, macro_end: int) -> str | None:
    """The argument of a box macro whose name ends at `macro_end`."""
    i = macro_end
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        return None
    if text[i] == "{":
        close = _match_braces(text, i)
        return None if close is None else _nonempty(text[i + 1 : close])
    # Brace-less `\boxed 5`: take one token; a sentence-ending period is not part of it.
    token = _BARE_TOKEN_RE.match(text, i)
    return None if token is None else _nonempty(token.group(0).rstrip(".,;"))


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces matched.

    `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`; `\\boxed 5` gives `5`; an unclosed
    last box gives None (a truncated completion has no answer).
    """
    boxes = list(_BOX_RE.finditer(text))
    if not boxes:
        return None
    return _box_argument(text, boxes[-1].end())


def _strip_answer(text: str) -> str:
    """Remove the decoration models put around a one-line answer."""
    text = _HOPE_RE.sub("", text)
    # Bold and a closing period; a leading `.` stays (`.5` is a number).
    text = text.strip().lstrip("*").rstrip("*. \t")
    math = _LEADING_MATH_RE.match(text)
    if math:
        return math.group(1).strip().rstrip(".").strip()
    # Inline-math wrappers: `$...$` and `\(...\)`.
    if text.startswith(r"\(") and text.endswith(r"\)"):
        text = text[2:-2]
    text = text.strip().strip("$").strip()
    return text.rstrip(".").strip()


def answer_line(text: str) -> str | None:
    """The answer after the last `Answer:` marker, up to the end of its line.

    Accepts `Answer:`, `**Answer:**`, `**Answer**:` and `Final Answer:` in any case, and
    Minerva's `Final Answer: The final answer is $…$. I hope it is correct.` (the sign-off
    and the `Final Answer:` are optional). Surrounding `$`, `*`, whitespace and a trailing
    period are stripped, and a line opening with `$…$` gives what is inside; if the line
    holds a `\\boxed{}`, its content is returned instead. When the marker ends its line
    (`Answer:\\n42`), the next non-empty line is used.
    """
    markers = list(_ANSWER_RE.finditer(text))
    if not markers:
        return None
    # lstrip skips blank lines after the marker; the answer is the first non-blank line.
    rest = text[markers[-1].end() :].lstrip()
    line = rest.split("\n", 1)[0]

    boxes = list(_BOX_RE.finditer(line))
    if boxes:
        # Match braces in the whole remainder: a boxed matrix may span several lines.
        return _box_argument(rest, boxes[-1].end())
    return _nonempty(_strip_answer(line))


def last_number(text: str) -> str | None:
    """The last number in `text` (int, decimal or negative), thousands commas removed.

    `1,234.5` gives `1234.5`; a sentence-ending period is never part of the number.
    """
    numbers = _NUMBER_RE.findall(text)
    if not numbers:
        return None
    return numbers[-1].replace(",", "")


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "boxed": last_boxed,
    "answer_line": answer_line,
    "last_number": last_number,
}

# The extractors that answer from any text, in no format a prompt asks for: a response cut
# by the token budget inside a numbered list ("1. First, … 2. 1 bolt … 3") has an answer by
# them. Templates and benchmarks list them after the strict ones.
FLEXIBLE = frozenset({"last_number"})


def extract_answer_by(text: str, methods: Sequence[str]) -> tuple[str | None, str | None]:
    """First non-empty answer found by `methods`, tried in order (names from EXTRACTORS),
    and the name of the method that found it; (None, None) when none does.

    Raises ValueError for an unknown method name (a config error, checked up front
    so it surfaces even on completions where an earlier method already succeeds).
    """
    unknown = [m for m in methods if m not in EXTRACTORS]
    if unknown:
        known = ", ".join(sorted(EXTRACTORS))
        raise ValueError(f"unknown answer extraction method(s) {unknown}; known: {known}")
    for method in methods:
        answer = _nonempty(EXTRACTORS[method](text))
        if answer is not None:
            return answer, method
    return None, None


def extract_answer(text: str, methods: Sequence[str]) -> str | None:
    """First non-empty answer found by `methods`, tried in order (see `extract_answer_by`)."""
    return extract_answer_by(text, methods)[0]
