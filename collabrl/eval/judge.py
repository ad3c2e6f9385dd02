"""Optional LLM judge for answers the rule-based checker rejected.

The judge's verdicts go to `judge.jsonl` and a separate `judge` block of
`metrics.json`; they never overwrite the rule-based `correct` field.
The prompt is RelayLLM's (appendix C.2), including its argument order.
"""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.engines.base import Engine, SamplingParams

JUDGE_SYSTEM = "You are a math answer checker."
JUDGE_USER = (
    "Hi, there is an answer: {answer},\n"
    "and the ground truth answer is:\n"
    "{gold},\n"
    "please check whether the answer\n"
    "is correct or not, and return the\n"
    "only Yes or No."
)
JUDGE_PARAMS = SamplingParams(max_tokens=8, temperature=0.1, seed=0)


@dataclass(frozen=True)
class Verdict:
    correct: bool
    raw: str


def judge_messages(answer: str, gold: str) -> list[dict[str, str]]:
    # One-pass substitution: an answer containing "{gold}" must stay verbatim.
    user = JUDGE_USER.format(answer=answer, gold=gold)
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(reply: str) -> bool:
    """True when the reply starts with 'yes' (after punctuation and markdown)."""
    return reply.strip().lstrip("*#>`\"' ").lower().startswith("yes")


def judge_answers(engine: Engine, pairs: list[tuple[str, str]]) -> list[Verdict]:
    """Ask the judge about (answer, gold) pairs; one request per pair, batched."""
    if not pairs:
        return []
    replies = engine.generate([judge_messages(a, g) for a, g in pairs], JUDGE_PARAMS)
    return [Verdict(parse_verdict(r[0].text), r[0].text) for r in replies]
