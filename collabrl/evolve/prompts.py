"""What the models read: a round's question with the shared-state digest, and reviews.

Prompts stay short for small models: the digest shows at most `digest_size` earlier
candidates of the problem, best verified first, each solution trimmed. Nothing here
ever sees a gold answer: candidates carry one (`correct`), and no prompt reads it.
"""

from __future__ import annotations

import re

from collabrl.engines.base import ChatMessage
from collabrl.evolve.state import CORRECT, INCORRECT, UNKNOWN, Candidate

REVIEW_SYSTEM = (
    "You check solutions to problems. Go through the proposed solution step by step and "
    "recompute what you can. End your reply with one line: `Verdict: correct` or "
    "`Verdict: incorrect`."
)

# The last `Verdict: …` line decides; markdown bold and a missing colon are tolerated.
# `incorrect` is tried before `correct`, which it contains.
_VERDICT_RE = re.compile(
    r"verdict\W{0,4}(incorrect|not correct|wrong|correct|right)\b", re.IGNORECASE
)


def trim(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters: its opening (the approach) and its end
    (the answer), with the middle replaced by an ellipsis."""
    text = text.strip()
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half].rstrip()} … {text[-half:].lstrip()}"


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """Best first: highest verified score, then the latest round, then the earliest
    proposed (a stable, deterministic order)."""
    return sorted(candidates, key=lambda c: (-c.score, -c.round))


def digest(candidates: list[Candidate], size: int, chars: int) -> str:
    """The shared notes on one problem: its `size` best earlier candidates."""
    best = rank(candidates)[:size]
    return "\n\n".join(_entry(n, c, chars) for n, c in enumerate(best, 1))


def rerun_lines(c: Candidate, chars: int) -> list[str]:
    """What re-running the candidate's code found: one line, or none when not re-run."""
    check = c.code_check
    if check is None:
        return []
    if check.source is None:
        return [f"Re-run: {check.verdict} ({check.output})."]
    output = trim(check.output, chars) or "nothing"
    return [
        f"Re-run of its {check.source.replace('_', ' ')}: {check.verdict}; it printed: {output}"
    ]


def _entry(number: int, c: Candidate, chars: int) -> str:
    errors = sum(check["error"] is not None for check in c.checks)
    verdicts = ", ".join(r.verdict for r in c.reviews) or "none"
    lines = [
        f"Attempt {number} (round {c.round}, model {c.model + 1}): answer {c.answer or 'none'}",
        f"Executed checks: {len(c.checks)} tool calls, {errors} failed. "
        f"Reviews: {verdicts}. Score: {c.score:.2f}",
        *rerun_lines(c, chars // 2),
        f"Solution: {trim(c.completion, chars)}",
    ]
    lines += [f"Review: {trim(r.text, chars // 2)}" for r in c.reviews]
    return "\n".join(lines)


def evolve_question(question: str, notes: str) -> str:
    """Round r > 1: the problem, then the shared notes and what to do with them."""
    if not notes:
        return question
    return (
        f"{question}\n\nEarlier attempts at this problem, by you and other models, with their "
        f"checks and reviews (they may be wrong):\n\n{notes}\n\nLearn from them: fix their "
        "mistakes or confirm a correct one, and solve the problem again."
    )


def review_messages(question: str, candidate: Candidate, chars: int) -> list[ChatMessage]:
    """The reviewer's prompt: the original problem (not the digest) and one candidate."""
    errors = sum(check["error"] is not None for check in candidate.checks)
    rerun = "".join(f"{line}\n" for line in rerun_lines(candidate, chars // 2))
    user = (
        f"Problem:\n{question}\n\nProposed solution:\n{trim(candidate.completion, chars)}\n\n"
        f"Proposed final answer: {candidate.answer}\n"
        f"Executed checks: {len(candidate.checks)} tool calls, {errors} failed.\n{rerun}\n"
        "Is the final answer correct? End with `Verdict: correct` or `Verdict: incorrect`."
    )
    return [{"role": "system", "content": REVIEW_SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> str:
    """CORRECT or INCORRECT from a review's last verdict line; UNKNOWN when it has none."""
    found = _VERDICT_RE.findall(text)
    if not found:
        return UNKNOWN
    return CORRECT if found[-1].lower() in ("correct", "right") else INCORRECT
