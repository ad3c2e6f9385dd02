"""Drop training rows that overlap a shipped evaluation benchmark.

A training problem is contaminated when, after `normalise`, it

* equals an evaluation problem (`exact`), or
* shares at least one n-gram of `words` with an evaluation problem (`ngram`),
  n = 13 by default: the GPT-3 / Tülu convention, long enough that shared
  phrasing ("Put your final answer within") does not match, short enough to catch
  a problem copied into a longer one.

A problem with fewer than n words has no n-gram, so it can only match exactly.
The evaluation side is indexed once (a dict from normalised text and from each
n-gram to where it came from), so checking a training row costs one lookup per
word: DAPO-Math-17k against every shipped evaluation set takes seconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from collabrl.data.benchmarks import Item, load_benchmark, registry

NGRAM = 13

# Asymptote diagram code is drawing boilerplate shared by unrelated problems
# ("draw((0,0)--(1,0)--cycle,linewidth(1))"), not problem text: it would make 13-grams
# match across different problems, so it is left out of both comparisons.
_ASY = re.compile(r"\[asy\].*?\[/asy\]", re.DOTALL)
# LaTeX spacing commands and `~` only move ink.
_LATEX_SPACING = re.compile(r"\\(?:quad|qquad|[,;:! ])|~")
# A token is a run of letters and digits, or one other visible character.
_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORD = re.compile(r"\w+")
# Punctuation, math delimiters, the LaTeX backslash and braces carry no content.
_DROPPED = frozenset(".,;:!?\"'`$\\{}")

How = Literal["exact", "ngram"]


def normalise(text: str) -> str:
    """The text exact matching compares: lowercased, diagrams, spacing and punctuation gone.

    Operators (+ - × = ( ) ^ …) stay, so "What is 8 + 6?" and "What is 8 - 6?" remain
    different problems.
    """
    text = _LATEX_SPACING.sub(" ", _ASY.sub(" ", text.lower()))
    return " ".join(t for t in _TOKEN.findall(text) if t not in _DROPPED)


def words(text: str) -> list[str]:
    """The word tokens n-grams are made of: `normalise`d text without its operators.

    Runs of symbols are short, so 13 tokens of LaTeX ("( a ) ( b ) …") would be far
    less than 13 words of shared problem text.
    """
    return _WORD.findall(normalise(text))


def ngrams(tokens: list[str], n: int) -> Iterator[tuple[str, ...]]:
    """Every run of n consecutive tokens (none when there are fewer than n)."""
    return (tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


@dataclass(frozen=True)
class Source:
    """The evaluation problem a training row matched."""

    benchmark: str
    item_id: str


@dataclass(frozen=True)
class Drop:
    """A training row left out, and why."""

    item: Item
    benchmark: str
    how: How
    eval_id: str


@dataclass
class Decontamination:
    """The rows kept, the rows dropped, and the benchmarks checked against."""

    kept: list[Item]
    dropped: list[Drop]
    benchmarks: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        """Dropped rows per evaluation benchmark and kind; every benchmark checked appears."""
        table = {name: {"exact": 0, "ngram": 0} for name in self.benchmarks}
        for drop in self.dropped:
            table[drop.benchmark][drop.how] += 1
        return table


@dataclass
class _Index:
    exact: dict[str, Source]
    # None marks phrasing: an n-gram in two or more different evaluation problems
    # ("where m and n are relatively prime positive integers find m n") is shared
    # wording, not one problem, and alone it would drop any AIME-style training row.
    ngram: dict[tuple[str, ...], Source | None]


def _index(against: dict[str, list[Item]], n: int) -> _Index:
    # setdefault: a problem shipped in two benchmarks is attributed to the first one
    # in `against` (registry order), so reports are deterministic.
    index = _Index({}, {})
    owner: dict[tuple[str, ...], str] = {}  # n-gram -> normalised text of its first problem
    for name, items in against.items():
        for item in items:
            source = Source(name, item.id)
            text = normalise(item.problem)
            index.exact.setdefault(text, source)
            for gram in ngrams(_WORD.findall(text), n):
                if owner.setdefault(gram, text) == text:
                    index.ngram.setdefault(gram, source)
                else:
                    index.ngram[gram] = None
    return index


def _match(item: Item, index: _Index, n: int) -> tuple[How, Source] | None:
    text = normalise(item.problem)  # once: both comparisons read it, as `_index` does
    source = index.exact.get(text)
    if source is not None:
        return "exact", source
    for gram in ngrams(_WORD.findall(text), n):
        source = index.ngram.get(gram)
        if source is not None:
            return "ngram", source
    return None


def decontaminate(
    items: list[Item], against: dict[str, list[Item]], n: int = NGRAM
) -> Decontamination:
    """Split `items` into rows kept and rows that overlap a problem in `against`.

    `against` maps a benchmark name to its items (`evaluation_sets()` for every
    shipped one). Order is kept; an exact match is reported before an n-gram one.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    index = _index(against, n)
    kept: list[Item] = []
    dropped: list[Drop] = []
    for item in items:
        match = _match(item, index, n)
        if match is None:
            kept.append(item)
        else:
            how, source = match
            dropped.append(Drop(item, source.benchmark, how, source.item_id))
    return Decontamination(kept, dropped, list(against))


def evaluation_sets() -> dict[str, list[Item]]:
    """Every shipped evaluation benchmark (registry entries without `split: train`)."""
    return {
        name: load_benchmark(name).items
        for name, spec in registry().items()
        if spec.split != "train"
    }
