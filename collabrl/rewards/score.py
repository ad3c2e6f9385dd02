"""The score of one answer against its gold answer: what every evaluation, training
rollout and teacher filter records of it, computed in one place.

An episode's answer is graded twice, as lm-eval grades GSM8K: strictly, when it is in
the format the prompt asks for (`\\boxed{}`, an `Answer:` line: "strict-match"), and
flexibly, by whichever extractor found it, the benchmark's last-number fallback
included ("flexible-extract"). A response the token budget cut has a last number
wherever the cut fell ("1. First, … 2. 1 bolt … 3"), so a training reward never pays
for a flexible answer of a truncated episode.
"""

from __future__ import annotations

from typing import Any

from collabrl.episode import Episode
from collabrl.rewards.extract import FLEXIBLE
from collabrl.rewards.f1 import token_f1
from collabrl.rewards.verify import AnswerType, is_equivalent

# Where `protocols.rounds.finish` records the extractor that found the episode's answer.
EXTRACTOR_KEY = "extractor"


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


def is_strict(episode: Episode) -> bool:
    """Whether the episode's answer (if any) is in the format its prompt asks for."""
    return episode.meta.get(EXTRACTOR_KEY) not in FLEXIBLE


def score_episode(
    episode: Episode, gold: str, answer_type: AnswerType = "math", training: bool = False
) -> dict[str, Any]:
    """`score_answer` of the episode's answer (`correct`: flexible-extract) and
    `strict_correct` (strict-match). With `training`, a truncated episode's flexible
    answer earns nothing: it is scored as no answer (the answer itself stays recorded)."""
    strict = is_strict(episode)
    cut = episode.end is not None and episode.end.truncated
    credited = episode.answer if strict or not (training and cut) else None
    scored = score_answer(credited, gold, answer_type)
    scored["answer"] = episode.answer
    scored["strict_correct"] = strict and scored["correct"]
    return scored
