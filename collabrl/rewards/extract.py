"""Pull the final answer out of a model completion.

Four extractors, each `str -> str | None`, tried in a caller-chosen order by
`extract_answer`:

- `boxed`: the last `\\boxed{...}` / `\\fbox{...}` (MATH-style prompts),
- `answer_line`: the answer after the last answer marker: an `Answer:` line (EAPO-style
  prompts), Minerva's `The final answer is $…$. I hope it is correct.`, GSM8K's `#### X`,
  or a sentence such as `The answer is 2.` (see `answer_line` for when it counts),
- `bold`: the last bold `**X**` holding a number or inline math (Markdown-writing models),
- `last_number`: the last number in the text (GSM8K fallback).

`boxed` and `answer_line` read an answer the model states as its answer (lm-eval's
"strict-match"); `bold` and `last_number` find one in any text, stated or not (lm-eval's
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
# Labels after which the rest of the line is the answer, whatever it holds: `Answer:`,
# `**Answer:**`, `**Answer**:`, `Final Answer:` (the `Final` needs no special case),
# Minerva's `The final answer is $…$` (with or without its `Final Answer:` in front) and
# GSM8K's `#### 72` at the start of a line. A `phrase` (`the answer is 2`) also occurs
# mid-sentence (`the answer is not obvious`, `the answer is 2 more than x`), so it counts
# only where an answer-shaped text follows it (`_phrase_answer`).
_ANSWER_RE = re.compile(
    r"(?P<label>\banswer\b(?:\s*\*\*)?\s*:(?:\s*\*\*)?|\bfinal answer is\b\s*:?|^[ \t]*####)"
    r"|(?P<phrase>\banswer is\b\s*:?)",
    re.IGNORECASE | re.MULTILINE,
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
# A phrase's number and the end of its sentence: at most two words after it (`72 clips.`),
# none holding a digit (`2 more than 6` is no answer).
_PHRASE_NUMBER_RE = re.compile(
    rf"(?P<number>{_NUMBER_RE.pattern})\**(?:\s+[A-Za-z]+){{0,2}}\s*\**\s*(?:[.!?;,](?:\s|$)|\.?$)"
)
# The start of an answer written in math: inline math, a macro, a bracket.
_MATH_START = ("$", "\\", "(", "[", "{")
# The end of a sentence (a decimal point is none).
_SENTENCE_END_RE = re.compile(r"[.!?](?:\s|$)")
# Bold text on one line; its content is read by `last_bold`.
_BOLD_RE = re.compile(r"\*\*([^*\n]+?)\*\*")


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
    """The answer after the last answer marker, up to the end of its line.

    Accepts `Answer:`, `**Answer:**`, `**Answer**:` and `Final Answer:` in any case,
    Minerva's `Final Answer: The final answer is $…$. I hope it is correct.` (the sign-off
    and the `Final Answer:` are optional) and GSM8K's `#### 72`. Surrounding `$`, `*`,
    whitespace and a trailing period are stripped, and a line opening with `$…$` gives what
    is inside; if the line holds a `\\boxed{}`, its content is returned instead. When the
    marker ends its line (`Answer:\\n42`), the next non-empty line is used.

    `The answer is X` (`The answer is: 2`, `So the answer is **72** clips.`) counts only
    when X is a number ending its sentence within two words, or math (`$…$`, a macro, a
    bracket); otherwise (`the answer is not obvious`, `the answer is 2 more than 6`) the
    marker before it is read.
    """
    for marker in reversed(list(_ANSWER_RE.finditer(text))):
        # lstrip skips blank lines after the marker; the answer is the first non-blank line.
        rest = text[marker.end() :].lstrip()
        if marker.lastgroup == "label":
            return _line_answer(rest)
        answer = _phrase_answer(rest)
        if answer is not None:
            return answer
    return None


def _line_answer(rest: str) -> str | None:
    """The answer on the first line of `rest`: its box's content, or the line undecorated."""
    line = rest.split("\n", 1)[0]
    boxes = list(_BOX_RE.finditer(line))
    if boxes:
        # Match braces in the whole remainder: a boxed matrix may span several lines.
        return _box_argument(rest, boxes[-1].end())
    if not _LEADING_MATH_RE.match(line.lstrip("* \t")):
        # `Answer: 8. Note that …`: the sentence after the answer is no part of it.
        line = _SENTENCE_END_RE.split(line, 1)[0]
    return _nonempty(_strip_answer(line))


def _phrase_answer(rest: str) -> str | None:
    """The answer a `the answer is` phrase gives, or None where what follows it is prose."""
    line = rest.split("\n", 1)[0].lstrip("* \t")
    number = _PHRASE_NUMBER_RE.match(line)
    if number:
        return number.group("number").replace(",", "")
    if not line.startswith(_MATH_START):
        return None
    if _BOX_RE.match(line) or _LEADING_MATH_RE.match(line):
        return _line_answer(line)
    # Math without delimiters (`\\frac{1}{2}.`, `(1, 2), so`): up to the sentence's end.
    return _nonempty(_strip_answer(_clause(_SENTENCE_END_RE.split(line, 1)[0])))


def _clause(text: str) -> str:
    """`text` up to its first `, ` outside brackets: `(1, 2), as shown` gives `(1, 2)`."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if depth <= 0 and text.startswith(", ", i):
            return text[:i]
    return text


def last_bold(text: str) -> str | None:
    """The content of the last bold `**X**` that is an answer: a number, or inline math
    (`**$\\frac12$**`). Headings and list markers (`**Step 2:**`, `**1.**`) are skipped."""
    for bold in reversed(list(_BOLD_RE.finditer(text))):
        content = bold.group(1).strip()
        if content.startswith(("$", "\\(")):
            return _nonempty(_strip_answer(content))
        if _NUMBER_RE.fullmatch(content.removeprefix("\\$").removeprefix("$")):
            return content.removeprefix("\\$").removeprefix("$").replace(",", "")
    return None


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
    "bold": last_bold,
    "last_number": last_number,
}

# The extractors that answer from any text, in no format a prompt asks for: a response cut
# by the token budget inside a numbered list ("1. First, … 2. 1 bolt … 3") has an answer by
# them. Templates and benchmarks list them after the strict ones.
FLEXIBLE = frozenset({"bold", "last_number"})


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
    for name in methods:
        answer = _nonempty(EXTRACTORS[name](text))
        if answer is not None:
            return answer, name
    return None, None


def extract_answer(text: str, methods: Sequence[str]) -> str | None:
    """First non-empty answer found by `methods`, tried in order (see `extract_answer_by`)."""
    return extract_answer_by(text, methods)[0]
