"""Tests for collabrl.eval.metrics against hand-computed values."""

from __future__ import annotations

import itertools
import math

import pytest

from collabrl.eval.metrics import (
    ProblemSamples,
    ks_for,
    log2_ks,
    majority_answer,
    normalize_answer,
    pass_at_k,
    sign_test,
    standard_errors,
    summarize,
)

# --- pass_at_k ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        # 1 - C(3,1)/C(4,1) = 1 - 3/4
        (4, 1, 1, 0.25),
        # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 1, 2, 0.5),
        # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 2, 2, 5 / 6),
        # no correct samples: 1 - C(5,3)/C(5,3) = 0
        (5, 0, 3, 0.0),
        # all correct: 1 - C(0,1)/C(5,1) = 1 - 0/5
        (5, 5, 1, 1.0),
        # n - c = 1 < k = 2, so every 2-subset holds a correct sample
        (4, 3, 2, 1.0),
        # k = n: any correct sample makes the full set pass
        (6, 1, 6, 1.0),
        # 1 - C(8,3)/C(10,3) = 1 - 56/120 = 64/120
        (10, 2, 3, 8 / 15),
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_1_is_fraction_correct() -> None:
    # pass@1 = 1 - (n-c)/n = c/n
    assert pass_at_k(32, 7, 1) == pytest.approx(7 / 32)


def _brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(1 for subset in subsets if any(i < c for i in subset))
    return hits / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_brute_force(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_is_finite() -> None:
    # C(1000, 500) overflows a float; the product form must not. With c = n/2 and k = 2:
    # 1 - C(500,2)/C(1000,2) = 1 - (500*499)/(1000*999) = 1 - 249500/999000
    value = pass_at_k(1000, 500, 2)
    assert math.isfinite(value)
    assert value == pytest.approx(1 - 249500 / 999000)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [
        (4, 1, 5),  # k > n
        (4, 1, 0),  # k < 1
        (4, 1, -1),  # k < 1
        (4, 5, 1),  # c > n
        (4, -1, 1),  # c < 0
    ],
)
def test_pass_at_k_rejects_bad_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


# --- ks_for ------------------------------------------------------------------------------------


def test_ks_for_lists_every_k() -> None:
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 3, 4]
    assert ks_for(32) == list(range(1, 33))


def test_ks_for_rejects_zero() -> None:
    with pytest.raises(ValueError):
        ks_for(0)


@pytest.mark.parametrize(
    ("n", "ks"),
    [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (33, [1, 2, 4, 8, 16, 32, 33])],
)
def test_log2_ks_are_the_powers_of_two_and_n(n: int, ks: list[int]) -> None:
    assert log2_ks(n) == ks


def test_log2_ks_rejects_zero() -> None:
    with pytest.raises(ValueError):
        log2_ks(0)


# --- majority_answer ---------------------------------------------------------------------------


def test_normalize_answer() -> None:
    assert normalize_answer("  $ 1 2 $ ") == "12"
    assert normalize_answer("\\frac{1}{2}") == "\\frac{1}{2}"


def test_majority_plain() -> None:
    assert majority_answer(["3", "5", "5", "3", "5"]) == "5"  # 5 votes x3, 3 votes x2


def test_majority_merges_formatting_variants() -> None:
    # "$5$", " 5 " and "5" are one answer (3 votes) against "4" (2 votes)
    assert majority_answer(["4", "$5$", "4", " 5 ", "5"]) == "$5$"


def test_majority_returns_first_occurrence_stripped() -> None:
    # dropping spaces would turn "\\cdot x" into "\\cdotx"; the raw (stripped) form is kept
    assert majority_answer([" 2 \\cdot x ", "2\\cdot x"]) == "2 \\cdot x"


def test_majority_tie_goes_to_first_occurrence() -> None:
    # "b" and "a" both have 2 votes; "b" appears first
    assert majority_answer(["b", "a", "a", "b"]) == "b"
    assert majority_answer(["a", "b", "b", "a"]) == "a"
    # three-way tie, one vote each
    assert majority_answer(["z", "y", "x"]) == "z"


def test_majority_ignores_none_and_empty() -> None:
    # None and empty answers do not vote: "7" wins with 1 vote over nothing
    assert majority_answer([None, None, "7", "", "$ $"]) == "7"
    # None appearing most often still loses to a single real answer
    assert majority_answer([None, "1", None]) == "1"


def test_majority_all_none() -> None:
    assert majority_answer([None, None]) is None
    assert majority_answer([]) is None
    assert majority_answer(["", " $ "]) is None


# --- summarize ---------------------------------------------------------------------------------


def _three_problems() -> list[ProblemSamples]:
    t, f = True, False
    return [
        # A: 2/4 correct, F1 mean (1 + 1 + 0.5 + 0)/4 = 0.625
        ProblemSamples("A", [t, t, f, f], [1.0, 1.0, 0.5, 0.0], ["1", "1", "2", None], True),
        # B: 1/4 correct, F1 mean (1 + 0 + 0 + 0)/4 = 0.25
        ProblemSamples("B", [t, f, f, f], [1.0, 0.0, 0.0, 0.0], ["3", "4", "4", "5"], False),
        # C: 5 samples, truncated to the first 4: 4/4 correct, F1 mean 1.0
        ProblemSamples(
            "C", [t, t, t, t, f], [1.0, 1.0, 1.0, 1.0, 0.0], ["9", "9", "9", "9", "8"], True
        ),
    ]


def test_summarize_three_problems_by_hand() -> None:
    out = summarize(_three_problems())
    # n = min(4, 4, 5) = 4; per-problem mean correctness: A 0.5, B 0.25, C 1.0
    assert out["samples_per_problem"] == 4
    assert out["problems"] == 3
    # avg@4 = (0.5 + 0.25 + 1.0)/3 = 1.75/3 = 7/12
    assert out["avg@4"] == pytest.approx(7 / 12)
    # pass@1 equals avg@n
    assert out["pass@1"] == pytest.approx(7 / 12)
    # pass@2: A 1 - C(2,2)/C(4,2) = 5/6; B 1 - C(3,2)/C(4,2) = 1/2; C 1
    #         mean = (5/6 + 3/6 + 6/6)/3 = (14/6)/3 = 7/9
    assert out["pass@2"] == pytest.approx(7 / 9)
    # pass@3: A 1 (n-c=2 < 3); B 1 - C(3,3)/C(4,3) = 3/4; C 1; mean = 2.75/3 = 11/12
    assert out["pass@3"] == pytest.approx(11 / 12)
    # pass@4: every problem has a correct sample among all 4
    assert out["pass@4"] == pytest.approx(1.0)
    assert "pass@5" not in out
    # maj@4: A True, B False, C True -> 2/3
    assert out["maj@4"] == pytest.approx(2 / 3)
    # f1@4 = (0.625 + 0.25 + 1.0)/3 = 1.875/3 = 0.625
    assert out["f1@4"] == pytest.approx(0.625)
    # var: mean 7/12; deviations -1/12, -4/12, 5/12; squares (1 + 16 + 25)/144 = 42/144
    #      population variance = (42/144)/3 = 7/72
    assert out["var"] == pytest.approx(7 / 72)
    # var_f1: mean 0.625; deviations 0, -0.375, 0.375; squares 0 + 2 * 0.140625 = 0.28125
    #         population variance = 0.28125/3 = 0.09375 = 3/32
    assert out["var_f1"] == pytest.approx(3 / 32)
    # stderr: sample variance = (42/144)/2 = 7/48; stderr = sqrt(7/48)/sqrt(3) = sqrt(7/144)
    assert out["stderr"] == pytest.approx(math.sqrt(7) / 12)
    assert set(out) == {
        "pass@1", "pass@2", "pass@3", "pass@4", "avg@4", "maj@4", "f1@4",
        "var", "var_f1", "stderr", "problems", "samples_per_problem",
    }  # fmt: skip


def test_standard_errors_three_problems_by_hand() -> None:
    # Each mean's sample standard deviation (ddof=1) over its 3 per-problem values, / sqrt(3).
    out = standard_errors(_three_problems())
    # pass@1 = avg@4: the summary's stderr, sqrt(7)/12
    assert out["pass@1"] == out["avg@4"] == pytest.approx(math.sqrt(7) / 12)
    # pass@2: 5/6, 1/2, 1 (mean 7/9); deviations 1/18, -5/18, 4/18; squares 42/324;
    #         / 2 = 7/108; / 3 = 7/324 -> sqrt(7)/18
    assert out["pass@2"] == pytest.approx(math.sqrt(7) / 18)
    # pass@3: 1, 3/4, 1 (mean 11/12); squares (1 + 4 + 1)/144; / 2 / 3 = 1/144 -> 1/12
    assert out["pass@3"] == pytest.approx(1 / 12)
    # pass@4: 1, 1, 1 -> no spread
    assert out["pass@4"] == 0.0
    # maj@4: 1, 0, 1 (mean 2/3); squares 6/9; / 2 / 3 = 1/9 -> 1/3
    assert out["maj@4"] == pytest.approx(1 / 3)
    # f1@4: 0.625, 0.25, 1.0; squares 0.28125; / 2 / 3 = 3/64 -> sqrt(3)/8
    assert out["f1@4"] == pytest.approx(math.sqrt(3) / 8)
    assert set(out) == {"pass@1", "pass@2", "pass@3", "pass@4", "avg@4", "maj@4", "f1@4"}
    # One problem: no spread to measure.
    assert standard_errors(_three_problems()[:1]) == dict.fromkeys(
        ("pass@1", "pass@2", "pass@3", "pass@4", "avg@4", "maj@4", "f1@4"), 0.0
    )


def test_summarize_skips_maj_when_unjudged() -> None:
    problems = _three_problems()
    problems[1].majority_correct = None
    out = summarize(problems)
    assert "maj@4" not in out
    assert out["avg@4"] == pytest.approx(7 / 12)


def test_summarize_single_problem_single_sample() -> None:
    # greedy decoding, one problem: avg@1 = pass@1 = 1, no spread, stderr 0 with |Q| < 2
    out = summarize([ProblemSamples("x", [True], [0.8], ["2"], True)])
    assert out["avg@1"] == 1.0
    assert out["pass@1"] == 1.0
    assert out["maj@1"] == 1.0
    assert out["f1@1"] == pytest.approx(0.8)
    assert out["var"] == 0.0
    assert out["var_f1"] == 0.0
    assert out["stderr"] == 0.0


def test_summarize_empty_raises() -> None:
    with pytest.raises(ValueError):
        summarize([])


def test_summarize_rejects_problem_without_samples() -> None:
    with pytest.raises(ValueError):
        summarize([ProblemSamples("x", [], [], [])])


def test_summarize_rejects_misaligned_lists() -> None:
    with pytest.raises(ValueError):
        summarize([ProblemSamples("x", [True, False], [1.0], ["1", "2"])])


@pytest.mark.parametrize(
    ("gained", "lost", "expected"),
    [(9, 1, 22 / 1024), (1, 9, 22 / 1024), (0, 0, 1.0), (3, 3, 1.0), (5, 0, 2 / 32)],
)
def test_sign_test_hand_values(gained: int, lost: int, expected: float) -> None:
    assert sign_test(gained, lost) == pytest.approx(expected)


@pytest.mark.parametrize(("gained", "lost"), [(29, 9), (20, 20), (0, 7), (12, 30), (1, 0)])
def test_sign_test_matches_scipys_binomial_test(gained: int, lost: int) -> None:
    stats = pytest.importorskip("scipy.stats")
    expected = stats.binomtest(gained, gained + lost, 0.5).pvalue
    assert sign_test(gained, lost) == pytest.approx(expected, rel=1e-9)
