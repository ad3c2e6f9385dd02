"""The answer a run returns for a problem, chosen over its candidates without gold.

Answers are grouped as the eval's majority vote groups them (`normalize_answer`:
formatting variants merge, `1/2` and `0.5` do not); a candidate without an answer
takes no part.

- `score`: the answer whose candidates' verified scores sum highest; ties go to the
  answer with more candidates, then to the one proposed first.
- `vote`: the answer most candidates give; ties go to the one proposed first.

- `verified`: the vote among the candidates whose code re-ran and agreed with their
  answer (`execute.py`); with none, the vote among those not refuted by their re-run;
  with every one refuted, the vote.

With every score 0 (no reviewer ever said correct) `score` falls back to `vote`.
"""

from __future__ import annotations

from collabrl.eval.metrics import majority_answer, normalize_answer
from collabrl.evolve.state import REFUTED, VERIFIED, Candidate


def select_by_score(candidates: list[Candidate]) -> str | None:
    totals: dict[str, list[float]] = {}  # answer key -> [summed score, count]; insertion order
    first_seen: dict[str, str] = {}
    for c in candidates:
        key = normalize_answer(c.answer) if c.answer else ""
        if not key:
            continue
        total = totals.setdefault(key, [0.0, 0])
        total[0] += c.score
        total[1] += 1
        first_seen.setdefault(key, c.answer.strip())
    if not totals:
        return None
    # max() keeps the first maximal key: the answer proposed first wins what remains tied.
    return first_seen[max(totals, key=lambda k: tuple(totals[k]))]


def select_by_vote(candidates: list[Candidate]) -> str | None:
    return majority_answer([c.answer for c in candidates])


def select_by_verified(candidates: list[Candidate]) -> str | None:
    verified = [c.answer for c in candidates if c.verdict == VERIFIED]
    standing = [c.answer for c in candidates if c.verdict != REFUTED]
    return majority_answer(verified) or majority_answer(standing) or select_by_vote(candidates)


SELECTORS = {"score": select_by_score, "vote": select_by_vote, "verified": select_by_verified}
