"""Token-level F1 between a predicted and a gold answer (SQuAD-style, as used by EAPO).

A partial-credit signal: `The answer is 204` against `204` scores 0.5, not 0.

EAPO (§2.1, §3.1) scores answers with "f1" and does not define it further; we use the
SQuAD token F1: lowercase, drop punctuation and the articles a/an/the, split on
whitespace, then the harmonic mean of precision and recall over the multiset of
tokens. Where we differ from SQuAD's `normalize_answer`, it is for numbers, which are
most of the answers EAPO trains and evaluates on (DAPO-Math, AIME, AIMO):

- Punctuation splits words instead of being deleted (SQuAD turns `3.5` into `35`).
- A number is one token: `.` and `/` between digits (`3.5`, `3/4`), a leading decimal
  point (`.5`), a sign that starts a number (`-5`, `(-5)`, `x = -5`, `+5`, and the
  Unicode minus `−5`) and thousands separators (`1,000` and `12,345,678`, not `3,4`)
  are kept. A `-` glued to a word, a digit or a closing bracket is a hyphen or a
  minus between terms and still splits (`x-5`, `3-5` give two tokens).
- Number tokens compare by exact value: `5`, `5.0`, `+5`, `05` and `5.00` are one
  token, and so are `1,000` and `1000`; `-5` and `5` differ, `-0` is `0`. A fraction
  of two integers is its value too, so `1/2`, `2/4`, `0.5` and `.50` match, but
  `0.333` is not `1/3` (no rounding). `3/4` and `3 / 4` still differ (the second
  is the tokens `3` and `4`), and `1/0` compares as text.
- When either side has no token left (only articles or punctuation), SQuAD scores
  the two as equal; we compare the raw strings, case-insensitively, so `the` and
  `a` score 0.
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

# Thousands separators: a run of 1-3 digits then groups of exactly three, glued to no
# other digit, comma or decimal point on the left and followed by no further digit or
# `,digit` (so `1,0000` and `1,000,0` are left alone and split at their commas).
_THOUSANDS_RE = re.compile(r"(?<![0-9,.])[0-9]{1,3}(?:,[0-9]{3})+(?![0-9]|,[0-9])")
# Punctuation is any non-word, non-space character (and `_`), except what belongs to a
# number: `.` or `/` between two digits, a leading decimal point, a sign before a
# number that is not glued to a word, a digit or a closing bracket.
_PUNCT_RE = re.compile(
    r"(?!(?<=[0-9])[./](?=[0-9]))"  # 3.5, 3/4
    r"(?!(?<![\w.])\.(?=[0-9]))"  # .5
    r"(?![-+](?<![\w)\]}][-+])(?=\.?[0-9]))"  # -5, +5, (-5), -.5
    r"(?:[^\w\s]|_)"
)
_NUMBER_RE = re.compile(r"[-+]?(?:[0-9]+/[0-9]+|[0-9]*\.?[0-9]+)")
# Minus signs other than the ASCII hyphen-minus (Unicode minus, small and full-width
# hyphen-minus).
_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})
_ARTICLES = frozenset({"a", "an", "the"})


def normalize_tokens(text: str) -> list[str]:
    """Lowercase, drop `$`, thousands separators and punctuation (punctuation splits
    words; numbers keep their sign, `.` and `/`), drop articles."""
    text = text.lower().translate(_MINUS).replace("$", " ")
    text = _THOUSANDS_RE.sub(lambda m: m.group().replace(",", ""), text)
    text = _PUNCT_RE.sub(" ", text)
    return [tok for tok in text.split() if tok not in _ARTICLES]


def number_key(token: str) -> str | None:
    """The token's exact value as `n` or `p/q` (reduced) when it is a number, else None.

    `5`, `+5.00` and `10/2` give `5`; `0.5`, `.5` and `2/4` give `1/2`; `-0` gives `0`.
    """
    if _NUMBER_RE.fullmatch(token) is None:
        return None
    try:
        value = Fraction(token)
        if value.denominator == 1:
            return str(value.numerator)
        return f"{value.numerator}/{value.denominator}"
    except (ValueError, ZeroDivisionError):  # `1/0`; past Python's int-string limit
        return None


def answer_tokens(text: str) -> list[str]:
    """The tokens F1 counts: `normalize_tokens`, each number replaced by its value."""
    return [number_key(tok) or tok for tok in normalize_tokens(text)]


def token_f1(pred: str | None, gold: str) -> float:
    """Harmonic mean of token precision and recall, counting tokens as a multiset."""
    if pred is None:
        return 0.0
    pred_tokens, gold_tokens = answer_tokens(pred), answer_tokens(gold)
    if not pred_tokens or not gold_tokens:
        # Nothing left to count (e.g. only articles or punctuation): fall back to equality.
        return 1.0 if pred.strip().lower() == gold.strip().lower() else 0.0
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)
