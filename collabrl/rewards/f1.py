"""Token-level F1 between a predicted and a gold answer (SQuAD-style, as used by EAPO).

A partial-credit signal: `The answer is 204` against `204` scores 0.5, not 0.
"""

from __future__ import annotations

import re
from collections import Counter

# Punctuation is any non-word, non-space character, except `.` or `/` between two digits,
# which belongs to a number (`3.5`, `3/4`) and must survive as part of one token.
_PUNCT_RE = re.compile(r"(?!(?<=\d)[./](?=\d))[^\w\s]|_")
_ARTICLES = frozenset({"a", "an", "the"})


def normalize_tokens(text: str) -> list[str]:
    """Lowercase, drop `$` and punctuation (punctuation splits words), drop articles."""
    text = _PUNCT_RE.sub(" ", text.lower().replace("$", " "))
    return [tok for tok in text.split() if tok not in _ARTICLES]


def token_f1(pred: str | None, gold: str) -> float:
    """Harmonic mean of token precision and recall, counting tokens as a multiset."""
    if pred is None:
        return 0.0
    pred_tokens, gold_tokens = normalize_tokens(pred), normalize_tokens(gold)
    if not pred_tokens or not gold_tokens:
        # Nothing left to count (e.g. only articles or punctuation): fall back to equality.
        return 1.0 if pred.strip().lower() == gold.strip().lower() else 0.0
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)
