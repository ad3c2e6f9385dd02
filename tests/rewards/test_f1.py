"""Token F1 against hand-computed values."""

import pytest

from collabrl.rewards.f1 import normalize_tokens, token_f1


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("x b c", "b c d", 2 / 3),  # P = R = 2/3
        ("a b c", "b c d", 0.8),  # `a` is an article: P = 1, R = 2/3
        ("The answer is 204", "204", 0.5),  # P = 1/3, R = 1
        ("3.5", "3.5", 1.0),
        ("$3.5$", "3.5", 1.0),
        ("3/4", "3 / 4", 0.0),  # `3/4` is one token, `3 / 4` three others
        ("7 7 7", "7", 0.5),  # multiset: only one 7 overlaps, P = 1/3, R = 1
        ("(3, 4)", "3 4", 1.0),  # punctuation splits words
        ("Paris!", "paris", 1.0),
        ("5", "6", 0.0),
        (None, "6", 0.0),
        ("", "", 1.0),
        ("the", "a", 0.0),  # both empty after normalization, but not equal
        ("", "6", 0.0),
    ],
)
def test_token_f1(pred: str | None, gold: str, expected: float) -> None:
    assert token_f1(pred, gold) == pytest.approx(expected)


def test_normalize_keeps_numbers_whole() -> None:
    assert normalize_tokens("The total is $1.5 or 3/4, an estimate.") == [
        "total",
        "is",
        "1.5",
        "or",
        "3/4",
        "estimate",
    ]
