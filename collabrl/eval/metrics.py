"""Evaluation metrics: small pure functions over sampled answers.

Every metric here works on plain values (counts, booleans, floats, answer strings). Whether an
answer is *correct* is decided elsewhere by an answer checker; this module never imports one, so
it stays cheap to test and free of heavyweight dependencies.

How our metric names map onto the names used in the papers we compare against (``N`` is the
number of samples per problem, e.g. 32):

=====================================  ====================  ==================================
Paper's name                           Our key               Meaning
=====================================  ====================  ==================================
RelayLLM "avg@32" / "mean@32"          ``avg@32``            mean over problems of the mean
                                                             correctness of the 32 samples
RelayLLM pass@1 (greedy decoding)      ``avg@1``, temp. 0    one greedy sample per problem;
                                                             equals ``pass@1``
EAPO "Pass@32"                         ``f1@32``             mean over problems of the mean
                                                             token F1 of the 32 samples
EAPO "Var"                             ``var_f1``            population variance across
                                                             problems of per-problem mean F1
Chen et al. (2021) pass@k              ``pass@k``            unbiased estimate of P(at least one
                                                             of k samples is correct)
=====================================  ====================  ==================================

``summarize`` also reports ``maj@N`` (majority vote), ``var`` (the same variance as ``var_f1`` but
over correctness), ``stderr`` (standard error of ``avg@N``), ``problems`` and
``samples_per_problem``; ``standard_errors`` gives the standard error of every metric that is a
mean over problems (results.json's ``<metric>_stderr``).

Every metric above grades an answer however it was found, the benchmark's last-number fallback
included. Where the samples also say whether their answer was in the format the prompt asks for,
``summarize`` reports lm-eval's two GSM8K numbers beside them: ``strict-match`` (the ``avg@N`` of
the answers in that format: ``\boxed{}``, an ``Answer:`` line) and ``flexible-extract`` (the
``avg@N`` of every answer, the last number of the text included, which is ``avg@N`` itself).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ProblemSamples",
    "ks_for",
    "log2_ks",
    "majority_answer",
    "normalize_answer",
    "pass_at_k",
    "population_variance",
    "problem_scores",
    "sign_test",
    "standard_errors",
    "summarize",
]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator of Chen et al. (2021): ``1 - C(n-c, k) / C(n, k)``.

    ``n`` samples were drawn for a problem and ``c`` of them are correct; the result is the
    probability that a uniformly random ``k``-subset of the samples contains a correct one.

    Raises:
        ValueError: if ``k < 1``, ``k > n``, ``c < 0`` or ``c > n``.
    """
    if k < 1 or k > n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got n={n}, k={k}")
    if c < 0 or c > n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    # Every k-subset must then include a correct sample; also avoids C(n-c, k) with n-c < k.
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i): a product of c factors in (0, 1],
    # which never forms the huge binomials that overflow floats for n in the hundreds.
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def sign_test(gained: int, lost: int) -> float:
    """Two-sided exact sign test (McNemar's exact test) of one set of problems scored twice:
    the chance, if the change did nothing, of a split between problems newly solved and
    problems lost at least this uneven. Problems scored alike both times say nothing."""
    changed = gained + lost
    if changed == 0:
        return 1.0
    tail = sum(math.comb(changed, i) for i in range(min(gained, lost) + 1)) / 2**changed
    return min(1.0, 2 * tail)


def concentration(
    solved: tuple[int, int], failed: tuple[int, int], alpha: float = 0.05
) -> tuple[float, bool]:
    """Issue 36's pre-registered criterion for "calls where the student fails alone":
    (calling, episodes) on the families it solves alone and on those it fails. Returns the
    one-sided Fisher exact p (the failed families call more often) and whether the calls
    concentrate: the solved families' share at most half the failed ones' and p < alpha."""
    from scipy.stats import fisher_exact

    (solved_calls, solved_n), (failed_calls, failed_n) = solved, failed
    table = [[failed_calls, failed_n - failed_calls], [solved_calls, solved_n - solved_calls]]
    p = float(fisher_exact(table, alternative="greater").pvalue)
    return p, solved_calls / solved_n <= failed_calls / failed_n / 2 and p < alpha


def ks_for(n: int) -> list[int]:
    """Every ``k`` for which pass@k is reported when ``n`` samples exist: ``[1, 2, ..., n]``.

    Raises:
        ValueError: if ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n}")
    return list(range(1, n + 1))


def log2_ks(n: int) -> list[int]:
    """The ``k`` shown of pass@k when ``n`` samples exist: ``1, 2, 4, ...`` up to ``n``, and ``n``.

    Raises:
        ValueError: if ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"need at least one sample, got n={n}")
    return sorted({2**i for i in range(n.bit_length())} | {n})


def normalize_answer(answer: str) -> str:
    """Light normalization used for voting: strip, then drop spaces and ``$`` signs.

    Deliberately shallow: it only merges formatting variants such as ``"$ 12 $"`` and ``"12"``.
    Mathematical equivalence (``1/2`` vs ``0.5``) is the answer checker's job, not the voter's.
    """
    return answer.strip().replace(" ", "").replace("$", "")


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """Most frequent answer among ``answers`` after :func:`normalize_answer`.

    ``None`` entries (no answer extracted) and answers that normalize to ``""`` do not vote.
    Ties go to the answer whose first occurrence comes earliest. The winner is returned as its
    first occurrence, only stripped: dropping spaces can change LaTeX meaning (``\\cdot x`` ->
    ``\\cdotx``), and the caller hands this string to an answer checker. Returns ``None`` when
    nothing votes.
    """
    counts: dict[str, int] = {}  # dicts keep insertion order, i.e. order of first occurrence
    first_seen: dict[str, str] = {}
    for answer in answers:
        if answer is None:
            continue
        key = normalize_answer(answer)
        if key:
            counts[key] = counts.get(key, 0) + 1
            first_seen.setdefault(key, answer.strip())
    if not counts:
        return None
    # max() returns the first maximal item, which is the earliest first occurrence.
    return first_seen[max(counts, key=counts.__getitem__)]


@dataclass
class ProblemSamples:
    """All sampled results for one problem, index-aligned across the lists.

    Attributes:
        item_id: the problem's id in its dataset.
        correct: per-sample correctness verdicts.
        f1: per-sample token F1 against the reference.
        answers: per-sample extracted answers (``None`` when nothing was extracted).
        majority_correct: whether the majority answer is correct. Filled by the caller, which
            owns the answer checker; ``None`` means "not judged" and suppresses ``maj@n``.
        strict: per-sample correctness of answers in the prompt's format only (lm-eval's
            strict-match); ``None`` (samples written before it was recorded) suppresses it.
    """

    item_id: str
    correct: list[bool]
    f1: list[float]
    answers: list[str | None]
    majority_correct: bool | None = None
    strict: list[bool] | None = None


def _mean(values: Sequence[float]) -> float:
    """Arithmetic mean, summed with ``math.fsum`` so long runs do not accumulate rounding."""
    return math.fsum(values) / len(values)


def population_variance(values: Sequence[float]) -> float:
    """Variance dividing by ``len(values)`` (EAPO's "Var" divides by |Q|)."""
    mu = _mean(values)
    return math.fsum((v - mu) ** 2 for v in values) / len(values)


def _standard_error(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1) over ``sqrt(len(values))``; 0.0 below two values."""
    q = len(values)
    if q < 2:
        return 0.0
    mu = _mean(values)
    sample_var = math.fsum((v - mu) ** 2 for v in values) / (q - 1)
    return math.sqrt(sample_var / q)


def _check_aligned(problem: ProblemSamples) -> None:
    """Reject a problem whose per-sample lists disagree in length or are empty."""
    m = len(problem.correct)
    if m == 0:
        raise ValueError(f"problem {problem.item_id!r} has no samples")
    lengths = [len(problem.f1), len(problem.answers)]
    lengths += [] if problem.strict is None else [len(problem.strict)]
    if any(length != m for length in lengths):
        raise ValueError(
            f"problem {problem.item_id!r}: correct/f1/answers/strict lengths differ "
            f"({'/'.join(map(str, [m, *lengths]))})"
        )


def problem_scores(problems: Sequence[ProblemSamples]) -> dict[str, list[float]]:
    """Each mean metric's per-problem values, in ``summarize``'s order: ``pass@k`` for every
    ``k <= n`` (the unbiased estimate of each problem), ``avg@n``, ``maj@n`` (only when every
    problem has ``majority_correct`` set), ``strict-match`` and ``flexible-extract`` (only
    when every problem has ``strict`` set) and ``f1@n``. A metric is the mean of its list.

    ``n`` is the smallest sample count over all problems; a problem with more samples
    contributes only its first ``n`` so that every problem is scored on the same budget
    (pass@k estimates from different ``n`` are not comparable). ``maj@n`` is the exception: it
    uses the caller's ``majority_correct`` verdict as given, so callers should vote over the
    first ``n`` answers.

    Raises:
        ValueError: if ``problems`` is empty, or a problem has no samples or misaligned lists.
    """
    if not problems:
        raise ValueError("cannot summarize an empty set of problems")
    for problem in problems:
        _check_aligned(problem)
    n = min(len(p.correct) for p in problems)
    correct_counts = [sum(p.correct[:n]) for p in problems]

    scores = {f"pass@{k}": [pass_at_k(n, c, k) for c in correct_counts] for k in ks_for(n)}
    scores[f"avg@{n}"] = [c / n for c in correct_counts]
    verdicts = [p.majority_correct for p in problems]
    if all(v is not None for v in verdicts):
        scores[f"maj@{n}"] = [float(bool(v)) for v in verdicts]
    strict = [p.strict[:n] for p in problems if p.strict is not None]
    if len(strict) == len(problems):
        scores["strict-match"] = [sum(s) / n for s in strict]
        scores["flexible-extract"] = scores[f"avg@{n}"]
    scores[f"f1@{n}"] = [_mean(p.f1[:n]) for p in problems]
    return scores


def summarize(problems: Sequence[ProblemSamples]) -> dict[str, float]:
    """Dataset-level metrics over per-problem samples: the mean of each of
    :func:`problem_scores`, then ``var``, ``var_f1``, ``stderr`` (of ``avg@n``), ``problems``
    and ``samples_per_problem``.

    Raises:
        ValueError: if ``problems`` is empty, or a problem has no samples or misaligned lists.
    """
    scores = problem_scores(problems)
    n = min(len(p.correct) for p in problems)
    out = {name: _mean(values) for name, values in scores.items()}
    out["var"] = population_variance(scores[f"avg@{n}"])
    out["var_f1"] = population_variance(scores[f"f1@{n}"])
    out["stderr"] = _standard_error(scores[f"avg@{n}"])
    out["problems"] = float(len(problems))
    out["samples_per_problem"] = float(n)
    return out


def standard_errors(problems: Sequence[ProblemSamples]) -> dict[str, float]:
    """The standard error of each mean metric of :func:`problem_scores`, keyed alike: the
    sample standard deviation (ddof=1) of its per-problem values over ``sqrt(problems)``,
    lm-eval's closed form for a mean (problems are the independent draws; a problem's
    samples are not). 0.0 for a single problem.

    Raises:
        ValueError: if ``problems`` is empty, or a problem has no samples or misaligned lists.
    """
    return {name: _standard_error(values) for name, values in problem_scores(problems).items()}
