"""The score of one answer against its gold answer: what every evaluation, training
rollout and teacher filter records of it, computed in one place."""

from __future__ import annotations

from typing import Any

from collabrl.rewards.f1 import token_f1
from collabrl.rewards.verify import AnswerType, is_equivalent


def score_answer(answer: str | None, gold: str, answer_type: AnswerType = "math") -> dict[str, Any]:
    """The answer, the gold answer, whether they are equivalent (graded as `answer_type`
    says, see verify.ANSWER_TYPES) and their token F1 (EAPO's partial credit); a missing
    answer is wrong, with F1 0."""
    return {
        "answer": answer,
        "gold": gold,
        "correct": is_equivalent(answer, gold, answer_type=answer_type),
        "f1": token_f1(answer, gold),
    }
