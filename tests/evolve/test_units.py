"""Selection, scores, verdict parsing and the digest, on hand-computed cases."""

from __future__ import annotations

import dataclasses

import pytest

from collabrl.evolve.prompts import digest, evolve_question, parse_verdict, rank, trim
from collabrl.evolve.select import select_by_score, select_by_vote
from collabrl.evolve.state import CORRECT, INCORRECT, UNKNOWN, Candidate, Review
from collabrl.evolve.verify import reviewers_of


def cand(answer: str | None, *verdicts: str, round_no: int = 1, model: int = 0) -> Candidate:
    reviews = [Review("r", v, f"looks {v}. Verdict: {v}") for v in verdicts]
    return Candidate(round_no, "p1", model, 0, answer, f"work for {answer}", [], reviews)


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("Step 1 ok.\nVerdict: correct", CORRECT),
        ("Verdict: incorrect", INCORRECT),
        ("**Verdict:** Correct.", CORRECT),
        ("verdict - wrong", INCORRECT),
        ("Verdict: not correct", INCORRECT),
        ("Verdict: correct\n... on second thought\nVerdict: incorrect", INCORRECT),  # last wins
        ("The answer is correct.", UNKNOWN),  # no verdict line
        ("Verdict: maybe", UNKNOWN),
        ("", UNKNOWN),
    ],
)
def test_parse_verdict(text: str, verdict: str) -> None:
    assert parse_verdict(text) == verdict


def test_score_is_the_share_of_correct_verdicts_and_unknown_counts_against() -> None:
    assert cand("4", CORRECT, INCORRECT).score == 0.5
    assert cand("4", CORRECT, UNKNOWN, CORRECT, CORRECT).score == 0.75
    assert cand("4", UNKNOWN).score == 0.0
    assert cand("4").score == 0.0  # not reviewed


def test_select_by_score_sums_scores_per_answer() -> None:
    # "7": 1.0; "5": 0.5 + 0.5 = 1.0 with two candidates; "9": 0 with three: score ties
    # between 7 and 5 go to more candidates, so 5; the vote goes to 9.
    pool = [cand("7", CORRECT), cand("5", CORRECT, INCORRECT), cand(" 5 ", CORRECT, UNKNOWN)]
    pool += [cand("9", INCORRECT)] * 3 + [cand(None, CORRECT)]
    assert select_by_score(pool) == "5"
    assert select_by_vote(pool) == "9"
    assert select_by_score(pool[:1] + [cand("$7$", CORRECT)]) == "7"  # formats merge


def test_ties_go_to_the_answer_proposed_first() -> None:
    pool = [cand("3", CORRECT), cand("8", CORRECT)]
    assert select_by_score(pool) == "3" and select_by_score(pool[::-1]) == "8"
    assert select_by_vote(pool) == "3" and select_by_vote(pool[::-1]) == "8"
    unreviewed = [cand("1"), cand("2"), cand("2")]  # all scores 0: score falls back to vote
    assert select_by_score(unreviewed) == select_by_vote(unreviewed) == "2"
    assert select_by_score([cand(None)]) is None and select_by_vote([cand(None)]) is None


def test_selection_and_digest_never_read_gold_correctness() -> None:
    pool = [cand("3", CORRECT), cand("8", CORRECT, CORRECT), cand("8", INCORRECT)]
    flipped = [dataclasses.replace(c, correct=not c.correct) for c in pool]
    assert select_by_score(pool) == select_by_score(flipped) == "8"
    assert select_by_vote(pool) == select_by_vote(flipped) == "8"
    assert digest(pool, 3, 100) == digest(flipped, 3, 100)


def test_digest_shows_the_best_m_candidates_trimmed() -> None:
    low, high = cand("11", INCORRECT), cand("22", CORRECT, round_no=1, model=1)
    newer = cand("33", INCORRECT, round_no=2)
    assert rank([low, high, newer]) == [high, newer, low]  # score, then the latest round
    text = digest([low, high, newer], size=2, chars=100)
    assert "Attempt 1 (round 1, model 2): answer 22" in text
    assert "Attempt 2 (round 2, model 1): answer 33" in text
    assert "answer 11" not in text
    assert "Reviews: correct. Score: 1.00" in text and "Verdict: correct" in text
    long = cand("5")
    long.completion = "A" * 300 + "B" * 300
    entry = digest([long], size=1, chars=40)
    assert "A" * 20 + " … " + "B" * 20 in entry and "A" * 21 not in entry


def test_trim_keeps_short_text_and_both_ends_of_long_text() -> None:
    assert trim("  short  ", 10) == "short"
    assert trim("abcdefghij", 4) == "ab … ij"


def test_round_question_holds_the_problem_then_the_notes() -> None:
    assert evolve_question("What is 2+2?", "") == "What is 2+2?"
    asked = evolve_question("What is 2+2?", "Attempt 1 …")
    assert asked.startswith("What is 2+2?") and "Attempt 1 …" in asked


def test_reviewers_are_the_other_models_or_every_verifier() -> None:
    c = cand("4", model=1)
    assert reviewers_of(c, 3, own_models=True) == [0, 2]
    assert reviewers_of(cand("4", model=0), 1, own_models=True) == [0]  # alone: itself
    assert reviewers_of(c, 2, own_models=False) == [0, 1]


def test_candidate_round_trips_through_its_record() -> None:
    c = cand("4", CORRECT, UNKNOWN)
    data = c.to_dict()
    assert data["score"] == 0.5
    assert Candidate.from_dict(data) == c
