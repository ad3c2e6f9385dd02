"""Token F1 against hand-computed values, and its properties."""

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collabrl.rewards.f1 import normalize_tokens, number_key, token_f1


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


# ----------------------------------------------------------------------- numbers (issue #22)


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        # The sign is part of the number: 2 % of DAPO-Math answers are negative.
        ("5", "-5", 0.0),
        ("-5", "5", 0.0),
        ("-5", "-5", 1.0),
        ("\u22125", "-5", 1.0),  # Unicode minus
        ("$-5$", "-5", 1.0),
        ("(-5, 3)", "-5 3", 1.0),
        ("x = -5", "-5", 2 / 3),  # [x, -5] against [-5]
        ("The answer is -204.", "204", 0.0),
        ("The answer is -204.", "-204", 0.5),
        ("-.5", "-0.5", 1.0),
        ("+5", "5", 1.0),
        ("-0", "0", 1.0),
        # A `-` glued to a word, a digit or a closing bracket is not a sign.
        ("x-5", "x 5", 1.0),
        ("3-5", "3 5", 1.0),
        ("COVID-19", "covid 19", 1.0),
        ("(2)-5", "2 5", 1.0),
        # Numbers compare by value.
        ("5", "5.0", 1.0),
        ("5.00", "5", 1.0),
        ("05", "5", 1.0),
        ("5.1", "5.10", 1.0),
        ("5.1", "5.01", 0.0),
        ("1,000", "1000", 1.0),
        ("12,345,678.5", "12345678.50", 1.0),
        ("3,4", "3 4", 1.0),  # not a thousands group: a pair
        ("1,0000", "10000", 0.0),  # nor this: `1` and `0000`
        # Fractions: exact value, no rounding.
        ("1/2", "0.5", 1.0),
        ("2/4", "1/2", 1.0),
        (".5", "1/2", 1.0),
        ("10/2", "5", 1.0),
        ("-3/4", "-0.75", 1.0),
        ("0.333", "1/3", 0.0),
        ("1/0", "1/0", 1.0),  # not a number: compared as text
        ("1/0", "2/0", 0.0),
    ],
)
def test_token_f1_numbers(pred: str, gold: str, expected: float) -> None:
    assert token_f1(pred, gold) == pytest.approx(expected)


def test_number_key() -> None:
    assert number_key("5") == number_key("+5.00") == number_key("10/2") == "5"
    assert number_key("0.5") == number_key(".5") == number_key("2/4") == "1/2"
    assert number_key("-0") == "0"
    assert number_key("-7/2") == "-7/2"
    for text in ("five", "1/0", "1.2.3", "3/4/5", "v1.2", "-", "1" * 5000):
        assert number_key(text) is None


def test_normalize_keeps_signs_and_drops_thousands_separators() -> None:
    assert normalize_tokens("Answer: x = -1,234.5, not 1,2 or y-3.") == [
        "answer",
        "x",
        "-1234.5",
        "not",
        "1",
        "2",
        "or",
        "y",
        "3",
    ]


# ------------------------------------------------------- SQuAD-style cases (by hand)


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("The Denver Broncos", "Denver Broncos", 1.0),
        ("Denver Broncos!", "the denver broncos", 1.0),
        # P = 1, R = 3/8: F1 = 6/11
        ("Santa Clara, California", "San Francisco Bay Area at Santa Clara, California", 6 / 11),
        ("an theory", "theory", 1.0),  # articles are whole words only
        ("Anne", "Ann", 0.0),
        ("cat sat", "the cat sat on a mat", 2 / 3),  # P = 1, R = 2/4
        ("the cat", "a dog", 0.0),
    ],
)
def test_token_f1_squad_style(pred: str, gold: str, expected: float) -> None:
    assert token_f1(pred, gold) == pytest.approx(expected)


# ------------------------------------------------------------------- properties

_TEXT = st.text(max_size=40)
_BIG = st.integers(min_value=-(10**12), max_value=10**12)


@given(_TEXT)
def test_f1_of_a_text_with_itself_is_one(text: str) -> None:
    assert token_f1(text, text) == 1.0


@given(_TEXT, _TEXT)
def test_f1_is_symmetric_and_bounded(a: str, b: str) -> None:
    assert token_f1(a, b) == pytest.approx(token_f1(b, a))
    assert 0.0 <= token_f1(a, b) <= 1.0


@given(_BIG, st.integers(min_value=0, max_value=4))
def test_an_integer_matches_its_other_spellings(n: int, zeros: int) -> None:
    spellings = [f"{n:,}", f"{n}.{'0' * zeros}" if zeros else str(n), f"${n}$", f"{n:+d}"]
    for spelling in spellings:
        assert token_f1(spelling, str(n)) == 1.0, spelling


@given(_BIG.filter(lambda n: n != 0))
def test_a_number_never_matches_its_negation(n: int) -> None:
    assert token_f1(str(n), str(-n)) == 0.0
    assert token_f1(f"The answer is {-n}.", str(n)) == 0.0
    assert token_f1(f"The answer is {n:,}.", str(n)) == 0.5


@given(
    st.integers(min_value=-1000, max_value=1000),
    st.integers(min_value=1, max_value=1000),
    st.integers(min_value=1, max_value=50),
)
def test_a_fraction_matches_its_equal_fractions_and_decimals(p: int, q: int, k: int) -> None:
    value = Fraction(p, q)
    assert token_f1(f"{p}/{q}", f"{p * k}/{q * k}") == 1.0
    # A value whose decimal expansion ends: the decimal matches too.
    exact = Decimal(p) / Decimal(q)
    if Fraction(exact) == value:
        assert token_f1(f"{p}/{q}", format(exact, "f")) == 1.0
