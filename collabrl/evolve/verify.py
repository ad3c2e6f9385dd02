"""Verifier feedback: every candidate is reviewed by other models, never against gold.

A review is a model's check of one candidate, ending in a verdict line that
`prompts.parse_verdict` reads. Who reviews: every `--verifier` model when some are
given, otherwise the proposing models other than the candidate's own (its own model
when it is the only one). A candidate without an answer is not reviewed: it has
nothing to check, and its score stays 0. Each reviewer reviews all its candidates of
a round in one batched call, and the reviewers run concurrently.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from collabrl.engines.base import Engine, SamplingParams
from collabrl.evolve.prompts import parse_verdict, review_messages
from collabrl.evolve.state import Candidate, Review

T = TypeVar("T")


@dataclass
class Reviewer:
    name: str  # the model reference or URL
    engine: Engine


def in_parallel(jobs: list[Callable[[], T]]) -> list[T]:
    """Run the jobs on one thread each and return their results in order (the first
    exception is raised once all have finished)."""
    with ThreadPoolExecutor(max_workers=max(len(jobs), 1), thread_name_prefix="evolve") as pool:
        futures = [pool.submit(job) for job in jobs]
    return [f.result() for f in futures]


def reviewers_of(candidate: Candidate, reviewers: int, own_models: bool) -> list[int]:
    """Indices of the reviewers of `candidate`: all of them (verifiers), or the
    proposing models except its own (`own_models`, with its own when it is alone)."""
    if not own_models:
        return list(range(reviewers))
    others = [j for j in range(reviewers) if j != candidate.model]
    return others or [candidate.model]


def review(
    candidates: list[Candidate],
    questions: dict[str, str],
    reviewers: list[Reviewer],
    own_models: bool,
    params: SamplingParams,
    chars: int,
) -> None:
    """Append every reviewer's review to the candidates it checks."""
    work: list[list[int]] = [[] for _ in reviewers]
    for i, c in enumerate(candidates):
        if c.answer is not None:
            for j in reviewers_of(c, len(reviewers), own_models):
                work[j].append(i)

    def job(j: int) -> list[str]:
        if not work[j]:
            return []
        prompts = [
            review_messages(questions[candidates[i].problem_id], candidates[i], chars)
            for i in work[j]
        ]
        return [g[0].text for g in reviewers[j].engine.generate(prompts, params)]

    texts = in_parallel([lambda j=j: job(j) for j in range(len(reviewers))])
    # Appended after the threads are done, in reviewer order: the same run, the same state.
    for j, reviewer in enumerate(reviewers):
        for i, text in zip(work[j], texts[j], strict=True):
            candidates[i].reviews.append(Review(reviewer.name, parse_verdict(text), text))
