"""rSIM's nine reasoning strategies and their keyword counting, on the base floor.

The strategy set (the action space of the planner's 9-way head, in the paper's order),
its guidance texts, and the keyword counting of appendix A.2 (`count_strategies`,
`keyword_pattern`). The `strategy` protocol and its planners choose among these, the
rewards score a step against them, a builder splits steps on `STEP_DELIMITER`: all of
them import this module, which imports none of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STEP_DELIMITER = "\n\n"  # the end of one reasoning step (rSIM appendix A.1)

# -- the strategies ---------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    """One action of the planner.

    The paper's Figure 2 texts are not in its text, so both strings are ours. The
    guidance is an unfinished lead-in that the reasoner completes as its own step: after
    a finished sentence ("Let me verify the result so far.") SmolLM2-135M ends the step
    at once with a blank line (31 of 32 tries), after a clause ("To verify the result so
    far,") it never does (0 of 32). The description is what a prompted planner reads.
    """

    name: str
    guidance: str
    description: str


# The paper's order (section 3.2); the position is the index of the planner's action head.
STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        "self-reflection",
        "Looking back at the previous steps to check them for mistakes,",
        "look back at the previous steps and check them for mistakes",
    ),
    Strategy(
        "decomposition",
        "Breaking the problem into smaller parts,",
        "break the problem into smaller parts",
    ),
    Strategy(
        "deep thinking",
        "Thinking carefully about what the problem requires,",
        "think carefully about what the problem requires",
    ),
    Strategy("validation", "To verify the result so far,", "verify the result so far"),
    Strategy(
        "summarization", "To summarize what we know so far,", "summarize what is known so far"
    ),
    Strategy(
        "prioritization",
        "Focusing on the most important part first,",
        "focus on the most important part first",
    ),
    Strategy("continuation", "Next,", "carry on with the next step"),
    Strategy("sub-planning", "To plan the next few steps,", "plan the next few steps"),
    Strategy(
        "terminal", "So the final answer is", "the solution is complete: give the final answer"
    ),
)
STRATEGY_NAMES: tuple[str, ...] = tuple(s.name for s in STRATEGIES)
TERMINAL = STRATEGY_NAMES.index("terminal")
CONTINUATION = STRATEGY_NAMES.index("continuation")

# -- counting strategies (appendix A.2) ------------------------------------------------

# Verbatim from rSIM appendix A.2; continuation and terminal have no list.
KEYWORDS: dict[str, tuple[str, ...]] = {
    "self-reflection": (
        "review", "revisit", "reflect", "reevaluate", "rethink", "reexamine", "reassess",
        "reconsider", "analyze", "assess", "validate", "critique", "inspect", "examine",
        "audit", "diagnose", "cross-check",
    ),
    "decomposition": (
        "decompose", "break down", "divide", "split", "separate", "segment", "partition",
        "dissect", "analyze", "unfold", "unwrap", "reduce", "map out", "organize", "structure",
    ),
    "deep thinking": (
        "contemplate", "deliberate", "reflect", "ponder", "mull over", "reason", "deduce",
        "infer", "evaluate", "scrutinize", "meditate", "analyze", "consider", "investigate",
        "explore",
    ),
    "validation": (
        "validate", "verify", "confirm", "check", "test", "justify", "prove", "cross-check",
        "ensure", "affirm", "support", "substantiate", "corroborate", "authenticate", "evaluate",
    ),
    "summarization": (
        "summarize", "recap", "restate", "paraphrase", "condense", "outline", "highlight",
        "abstract", "generalize", "simplify", "extract", "distill", "encapsulate", "conclude",
        "report",
    ),
    "prioritization": (
        "prioritize", "rank", "order", "select", "choose", "emphasize", "highlight", "focus on",
        "weigh", "assess", "sort", "filter", "arrange", "allocate", "favor",
    ),
    "sub-planning": (
        "plan", "outline", "design", "strategize", "organize", "arrange", "map out",
        "formulate", "structure", "prepare", "coordinate", "blueprint", "set up",
    ),
}  # fmt: skip

# Irregular verb forms the suffix rule below cannot build.
_IRREGULAR: dict[str, tuple[str, ...]] = {
    "break": ("broke", "broken"),
    "choose": ("chose", "chosen"),
    "prove": ("proven",),
    "rethink": ("rethought",),
}
# Endings after a stem; the -ion/-ation/-ment forms are those of the strategy names
# themselves (validation, decomposition, summarization, prioritization).
_E_ENDINGS = ("e", "es", "ed", "ing", "ion", "ions", "ation", "ations", "ition", "itions",
              "tion", "tions", "ement", "ements")  # fmt: skip
_Y_ENDINGS = ("y", "ies", "ied", "ying", "ication", "ications")
_PLAIN_ENDINGS = ("", "s", "es", "ed", "ing", "ion", "ions", "ation", "ations", "ment", "ments")


def _word_forms(word: str) -> str:
    """A regex for a verb and its regular inflections (see `count_strategies`)."""
    if word.endswith("e"):
        stem, endings = word[:-1], _E_ENDINGS
    elif len(word) > 2 and word.endswith("y") and word[-2] not in "aeiou":
        stem, endings = word[:-1], _Y_ENDINGS
    else:  # plan -> planned, split -> splitting: the final consonant may double
        stem, endings = word, (*_PLAIN_ENDINGS, f"{word[-1]}ed", f"{word[-1]}ing")
    pattern = re.escape(stem).replace(r"\-", r"[-\s]?")  # cross-check, cross check
    if stem.endswith(("iz", "yz")):  # British -ise/-yse spellings
        pattern = pattern[:-1] + "[sz]"
    forms = f"{pattern}(?:{'|'.join(endings)})"
    irregular = _IRREGULAR.get(word, ())
    return f"(?:{'|'.join((forms, *irregular))})" if irregular else forms


def keyword_pattern(keyword: str) -> str:
    """A regex for `keyword` in the inflections `count_strategies` matches (no word
    boundaries: callers join several). A phrase inflects its verb, its first word:
    'breaking down', 'mapped out'."""
    first, *rest = keyword.split()
    return _word_forms(first) + "".join(rf"\s+{re.escape(w)}" for w in rest)


_KEYWORD_RES: dict[str, re.Pattern[str]] = {
    name: re.compile(rf"\b(?:{'|'.join(map(keyword_pattern, words))})\b", re.IGNORECASE)
    for name, words in KEYWORDS.items()
}


def count_strategies(text: str) -> dict[str, int]:
    """Steps of `text` that use each of the seven counted strategies (rSIM appendix A.2).

    The text is split into steps on "\\n\\n"; a step counts once for a strategy when any
    of its keywords appears in it. A keyword matches case-insensitively, as a whole word,
    in its regular inflections: a final -e dropped before an ending (validate ->
    validated, validating, validation), a final consonant+y turned into -i- (verify ->
    verified, verification), a final consonant doubled (plan -> planned, planning), the
    endings -s -es -ed -ing -ion -ation -ment, British -ise for -ize, and a few irregular
    forms (chose, broke down, rethought, proven). A phrase inflects its first word
    (breaking down, focused on). Derived words of another shape (analysis, proof,
    summary) do not match.
    """
    counts = dict.fromkeys(KEYWORDS, 0)
    for step in text.split(STEP_DELIMITER):
        for name, pattern in _KEYWORD_RES.items():
            if pattern.search(step):
                counts[name] += 1
    return counts
