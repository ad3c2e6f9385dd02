"""The `reference` stand-in: a teacher or expert that answers from the item's gold answer.

On a CPU the only model is SmolLM2-135M, so a "teacher" or "expert" is no stronger than
the student and a relay or consult run cannot show whether calling helps. The stand-in
plays a perfect collaborator instead: it writes the item's reference solution (when the
data has one) and its answer, cut to the tokens it was asked for. `reference@P` is a
fallible one: right on a share P of the problems (a fixed draw per problem), a near
miss on the rest, so that calling it is a risk, as calling a real teacher is. It reads
the gold answer, so it is for CPU demos and for testing the training signal, never a
result to report. The expert pool answers it without an engine (`engines/pool.py`).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collabrl.engines.base import Completion
from collabrl.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REFERENCE = "reference"  # the collaborator reference that names the stand-in
STAND_IN_NOTE = (
    "The reference collaborator is a stand-in that answers from the gold answer, "
    "for CPU demos and tests of the training signal; these numbers are not a result."
)

# GSM8K's calculator annotations (`<<48/2=24>>`) and its closing `#### 72` line: data
# markup, not part of a written solution. Every annotation holds an `=`, so LaTeX's `<<`
# is left alone.
_CALCULATOR = re.compile(r"<<[^<>\n]*=[^<>\n]*>>")
_FINAL_LINE = re.compile(r"\n?####[^\n]*\s*\Z")


# `reference@0.7`: a stand-in right on 70 % of the problems, a near miss on the rest.
_FALLIBLE = re.compile(r"reference@(.*)")


@dataclass(frozen=True)
class Reference:
    """What the stand-in knows of an item: its gold answer and, if any, its solution."""

    answer: str
    solution: str | None = None
    # The item's id: which problems a fallible stand-in gets wrong is one draw per id.
    key: str = ""


def stand_in_accuracy(ref: str) -> float | None:
    """How often the stand-in `ref` is right: `reference` always, `reference@P` on a share
    P of the problems; None when `ref` names no stand-in."""
    if ref == REFERENCE:
        return 1.0
    match = _FALLIBLE.fullmatch(ref)
    if match is None:
        if ref.lower() == REFERENCE or _FALLIBLE.fullmatch(ref.lower()):
            # Not a model either: a typo of the stand-in, which would fail as a path.
            raise UserError(
                f"'{ref}' is not a collaborator: the stand-in is written in lower case",
                f"write {ref.lower()}",
            )
        return None
    try:
        accuracy = float(match.group(1))
    except ValueError:
        accuracy = math.nan
    if not 0.0 <= accuracy <= 1.0:
        raise UserError(
            f"'{ref}': a stand-in's accuracy is a number from 0 to 1",
            "write e.g. reference@0.7 (right on 70% of the problems)",
        )
    return accuracy


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


def _draw(text: str) -> float:
    """A number in [0, 1) fixed by `text` (the same in every process and run)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def reference_text(reference: Reference) -> str:
    """The full reply: the cleaned solution, then the boxed answer."""
    final = f"The final answer is $\\boxed{{{reference.answer}}}$."
    if reference.solution is None:
        return final
    solution = _FINAL_LINE.sub("", _CALCULATOR.sub("", reference.solution)).strip()
    return f"{solution}\n\n{final}" if solution else final


def reference_completion(
    reference: Reference,
    max_tokens: int,
    tokenizer: PreTrainedTokenizerBase,
    accuracy: float = 1.0,
) -> Completion:
    """The reply cut to its first `max_tokens` tokens of `tokenizer` (a near miss on a
    problem a stand-in of `accuracy` does not know).

    Stateless: every call starts from the beginning of the reply, because the stand-in
    has no model of the partial answer it is continuing and cannot tell where in its own
    text the policy has got to. finish_reason is "stop" when the whole reply fit (the
    relay protocol reads that as the teacher's EOS and ends the episode), "length" when
    it was cut.
    """
    if not knows(reference, accuracy):
        reference = near_miss(reference)
    ids = tokenizer(reference_text(reference), add_special_tokens=False)["input_ids"]
    kept = ids[:max_tokens]
    text = tokenizer.decode(kept, skip_special_tokens=True)
    return Completion(text, kept, finish_reason="stop" if len(kept) == len(ids) else "length")
