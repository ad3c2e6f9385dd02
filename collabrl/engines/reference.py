"""The `reference` stand-in: a teacher or expert that answers from the item's gold answer.

On a CPU the only model is SmolLM2-135M, so a "teacher" or "expert" is no stronger than
the student and a relay or consult run cannot show whether calling helps. The stand-in
plays a perfect collaborator instead: it writes the item's reference solution (when the
data has one) and its answer, cut to the tokens it was asked for. `reference@P` is a
fallible one: right on a share P of the problems (a fixed draw per problem), a near
miss on the rest, so that calling it is a risk, as calling a real teacher is. It reads
the gold answer, so it is for CPU demos and for testing the training signal, never a
result to report. The expert pool answers it without an engine (`engines/pool.py`).

`reference-continue` (and `reference-continue@P`) is the same stand-in as a teacher that
continues the text it is given: it finds how far into its reply the partial answer has
got (`reached`) and writes the next tokens from there, so that with a worked solution in
the data a short call gives only part of the way (RelayLLM's "the teacher writes the next
n tokens"). It is a spelling of its own, so that every `reference@P` run keeps its meaning.

`reference-solution` (and `reference-solution@P`) is the expert that teaches: on the
problems it knows it writes what `reference@P` writes (the worked solution where the
data has one, then the answer), and on the others the same worked solution with its last
statement of the answer slipped to the near miss, so a wrong reply reads like a wrong
solution rather than a bare number. A policy trained with it has steps to internalise
whichever way the draw fell; `reference@P` keeps its bare near misses.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collabrl.engines.base import Completion
from collabrl.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REFERENCE = "reference"  # the collaborator reference that names the stand-in
CONTINUE = "reference-continue"  # the stand-in that continues the partial answer it is given
SOLUTION = "reference-solution"  # the stand-in that writes its worked solution, right or wrong
STAND_IN_NOTE = (
    "The reference collaborator is a stand-in that answers from the gold answer, "
    "for CPU demos and tests of the training signal; these numbers are not a result."
)

# GSM8K's calculator annotations (`<<48/2=24>>`) and its closing `#### 72` line: data
# markup, not part of a written solution. Every annotation holds an `=`, so LaTeX's `<<`
# is left alone.
_CALCULATOR = re.compile(r"<<[^<>\n]*=[^<>\n]*>>")
_FINAL_LINE = re.compile(r"\n?####[^\n]*\s*\Z")


# `reference@0.7`: a stand-in right on 70 % of the problems, a near miss on the rest;
# `reference-continue@0.7` the same, continuing the partial answer it is given;
# `reference-solution@0.7` the same, its near misses worked solutions too.
_STAND_IN = re.compile(f"({CONTINUE}|{SOLUTION}|{REFERENCE})(?:@(.*))?")
# The fewest non-space characters of a step that a partial answer must end with to count
# as being inside that step, unless its last line is that start: fewer ("=", "3") at the
# end of a line of its own match by chance.
_MIN_MIDSTEP = 3


@dataclass(frozen=True)
class Reference:
    """What the stand-in knows of an item: its gold answer and, if any, its solution."""

    answer: str
    solution: str | None = None
    # The item's id: which problems a fallible stand-in gets wrong is one draw per id.
    key: str = ""


def stand_in_accuracy(ref: str) -> float | None:
    """How often the stand-in `ref` is right: `reference` (or `reference-continue`,
    `reference-solution`) always, `reference@P` on a share P of the problems; None when
    `ref` names no stand-in."""
    match = _STAND_IN.fullmatch(ref)
    if match is None:
        if _STAND_IN.fullmatch(ref.lower()):
            # Not a model either: a typo of the stand-in, which would fail as a path.
            raise UserError(
                f"'{ref}' is not a collaborator: the stand-in is written in lower case",
                f"write {ref.lower()}",
            )
        return None
    if match.group(2) is None:
        return 1.0
    try:
        accuracy = float(match.group(2))
    except ValueError:
        accuracy = math.nan
    if not 0.0 <= accuracy <= 1.0:
        raise UserError(
            f"'{ref}': a stand-in's accuracy is a number from 0 to 1",
            f"write e.g. {match.group(1)}@0.7 (right on 70% of the problems)",
        )
    return accuracy


def stand_in_continues(ref: str) -> bool:
    """Whether the stand-in `ref` continues the partial answer it is given
    (`reference-continue[@P]`) rather than starting its reply at every call."""
    match = _STAND_IN.fullmatch(ref)
    return match is not None and match.group(1) == CONTINUE


def stand_in_teaches(ref: str) -> bool:
    """Whether the stand-in `ref` writes its worked solution on the problems it does not
    know too (`reference-solution[@P]`), rather than a bare near miss."""
    match = _STAND_IN.fullmatch(ref)
    return match is not None and match.group(1) == SOLUTION


def stand_in_description(ref: str) -> str | None:
    """What the stand-in `ref` replies, in a few words (the dry run lists it); None when
    `ref` names no stand-in."""
    accuracy = stand_in_accuracy(ref)
    if accuracy is None:
        return None
    if stand_in_teaches(ref):
        reply = "a worked solution"
    elif stand_in_continues(ref):
        reply = "the worked solution's next tokens"
    else:
        reply = "the gold answer"
    return f"the reference stand-in ({reply}, right on {accuracy:.0%} of problems, no model)"


def is_stand_in(ref: str) -> bool:
    return stand_in_accuracy(ref) is not None


def knows(reference: Reference, accuracy: float) -> bool:
    """Whether a stand-in right on a share `accuracy` of the problems is right on this one:
    a fixed draw per problem, so every call on it agrees and calling again cannot help,
    as with a real teacher that cannot solve it."""
    return accuracy >= 1.0 or _draw(f"knows:{reference.key}") < accuracy


def near_miss(reference: Reference) -> Reference:
    """What a stand-in writes for a problem it does not know: a wrong answer near the gold
    one (an integer off by 1 to 9), with no solution."""
    offset = 1 + int(_draw(f"miss:{reference.key}") * 9)
    try:
        wrong = str(int(reference.answer) + offset)
    except ValueError:
        wrong = f"{reference.answer}+{offset}"
    return Reference(wrong, None, reference.key)


def slipped(reference: Reference) -> Reference:
    """What `reference-solution@P` writes for a problem it does not know: the near miss,
    with the worked solution whose last statement of the gold answer is the near miss.

    The slip is in the solution's last step because a reply whose steps reach the gold
    answer and whose final line states another would carry a tell no real expert gives:
    a policy could learn to check that line against the steps instead of the arithmetic.
    A solution that never states the answer keeps its steps as they are.
    """
    miss = near_miss(reference)
    if reference.solution is None:
        return miss
    solution = clean_solution(reference.solution)
    # The answer as a whole number: not the 10 of 110 or of 10.5 (a sentence's period is fine).
    stated = list(re.finditer(rf"(?<![\d.]){re.escape(reference.answer)}(?!\.?\d)", solution))
    if stated:
        last = stated[-1]
        solution = solution[: last.start()] + miss.answer + solution[last.end() :]
    return Reference(miss.answer, solution, reference.key)


def _draw(text: str) -> float:
    """A number in [0, 1) fixed by `text` (the same in every process and run)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def reference_text(reference: Reference) -> str:
    """The full reply: the cleaned solution, then the boxed answer."""
    final = f"The final answer is $\\boxed{{{reference.answer}}}$."
    if reference.solution is None:
        return final
    solution = clean_solution(reference.solution)
    return f"{solution}\n\n{final}" if solution else final


def clean_solution(solution: str) -> str:
    """A worked solution as it is written out: without GSM8K's calculator annotations
    and its `#### N` line."""
    return _FINAL_LINE.sub("", _CALCULATOR.sub("", solution)).strip()


def reached(reply: str, written: str) -> int:
    """How far into `reply` (a character offset) the partial answer `written` has got.

    Spaces are not compared (a policy spaces `36×15` as it likes). A step (line) of the
    reply that `written` holds anywhere has been done, so the position is at least the
    end of the last such step; past it, a partial answer that ends inside the next step
    (its last line is that step's start, or it ends with a few characters of it) is
    continued from there, mid-step.
    """
    compact = _compact(written)
    lines = reply.splitlines(keepends=True)
    ends = list(itertools.accumulate(map(len, lines)))
    done = [i for i, line in enumerate(lines) if _compact(line) and _compact(line) in compact]
    position = ends[done[-1]] if done else 0
    # The next step (blank lines are no step), which the partial answer may have begun.
    after = done[-1] + 1 if done else 0
    following = next((i for i in range(after, len(lines)) if lines[i].strip()), None)
    if following is None:
        return position
    # The partial answer's own last line: when it is the start of the next step, the
    # step has begun, however short the start (a call cut it after "= 1").
    current = _compact(written.rsplit("\n", 1)[-1])
    line = lines[following]
    # The longest start of the next step that the partial answer ends with.
    for end in range(len(line.rstrip()), 0, -1):
        start = _compact(line[:end])
        # Ends on a character, not a space: the space is the continuation's.
        if line[end - 1].isspace() or not compact.endswith(start):
            continue
        if start == current or len(start) >= _MIN_MIDSTEP:
            return ends[following] - len(line) + end
    return position


def _compact(text: str) -> str:
    return "".join(text.split())


def continuation(reply: str, written: str) -> str:
    """The rest of `reply` after the point `written` has reached, spaced to follow it: a
    new step starts on a new line, a step already begun goes on after one space."""
    position = reached(reply, written)
    rest = reply[position:]
    if not rest or not written.strip():
        return rest
    if position == 0 or reply[position - 1] == "\n":
        return rest if written.endswith("\n") else "\n" + rest.lstrip(" \n")
    return rest.lstrip(" ") if written[-1].isspace() else rest


def reference_completion(
    reference: Reference,
    max_tokens: int,
    tokenizer: PreTrainedTokenizerBase,
    accuracy: float = 1.0,
    written: str | None = None,
    teaches: bool = False,
) -> Completion:
    """The reply cut to its first `max_tokens` tokens of `tokenizer` (a near miss on a
    problem a stand-in of `accuracy` does not know: with `teaches`, the worked solution
    slipped to it, `reference-solution@P`).

    With `written` None the call is stateless: every call starts from the beginning of
    the reply (`reference@P`, which has no model of the partial answer it is
    continuing). With `written`, the partial answer so far (`reference-continue@P`), the
    reply is what follows the point of the reply that `written` has reached. finish_reason
    is "stop" when the whole reply fit (the relay protocol reads that as the teacher's EOS
    and ends the episode), "length" when it was cut.
    """
    if not knows(reference, accuracy):
        reference = slipped(reference) if teaches else near_miss(reference)
    text = reference_text(reference)
    if written is not None:
        text = continuation(text, written)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    kept = ids[:max_tokens]
    text = tokenizer.decode(kept, skip_special_tokens=True)
    return Completion(text, kept, finish_reason="stop" if len(kept) == len(ids) else "length")
