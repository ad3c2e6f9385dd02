"""The `reference` stand-in: a teacher or expert that answers from the item's gold answer.

On a CPU the only model is SmolLM2-135M, so a "teacher" or "expert" is no stronger than
the student and a relay or consult run cannot show whether calling helps. The stand-in
plays a perfect collaborator instead: it writes the item's reference solution (when the
data has one) and its answer, cut to the tokens it was asked for. It reads the gold
answer, so it is for CPU demos and for testing the training signal, never a result to
report. The expert pool answers it without an engine (`engines/pool.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collabrl.engines.base import Completion

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REFERENCE = "reference"  # the collaborator reference that names the stand-in
REFERENCE_NAME = "reference (stand-in)"  # its endpoint name in call records and transcripts
STAND_IN_NOTE = (
    "The reference collaborator is a stand-in that answers from the gold answer, "
    "for CPU demos and tests of the training signal; these numbers are not a result."
)

# GSM8K's calculator annotations (`<<48/2=24>>`) and its closing `#### 72` line: data
# markup, not part of a written solution. Every annotation holds an `=`, so LaTeX's `<<`
# is left alone.
_CALCULATOR = re.compile(r"<<[^<>\n]*=[^<>\n]*>>")
_FINAL_LINE = re.compile(r"\n?####[^\n]*\s*\Z")


@dataclass(frozen=True)
class Reference:
    """What the stand-in knows of an item: its gold answer and, if any, its solution."""

    answer: str
    solution: str | None = None


def reference_text(reference: Reference) -> str:
    """The full reply: the cleaned solution, then the boxed answer."""
    final = f"The final answer is $\\boxed{{{reference.answer}}}$."
    if reference.solution is None:
        return final
    solution = _FINAL_LINE.sub("", _CALCULATOR.sub("", reference.solution)).strip()
    return f"{solution}\n\n{final}" if solution else final


def reference_completion(
    reference: Reference, max_tokens: int, tokenizer: PreTrainedTokenizerBase
) -> Completion:
    """The reply cut to its first `max_tokens` tokens of `tokenizer`.

    Stateless: every call starts from the beginning of the reply, because the stand-in
    has no model of the partial answer it is continuing and cannot tell where in its own
    text the policy has got to. finish_reason is "stop" when the whole reply fit (the
    relay protocol reads that as the teacher's EOS and ends the episode), "length" when
    it was cut.
    """
    ids = tokenizer(reference_text(reference), add_special_tokens=False)["input_ids"]
    kept = ids[:max_tokens]
    text = tokenizer.decode(kept, skip_special_tokens=True)
    return Completion(text, kept, finish_reason="stop" if len(kept) == len(ids) else "length")
