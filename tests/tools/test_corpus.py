"""The retrieval corpus: overlapped chunking, and what the installed libraries yield."""

from __future__ import annotations

import pytest

from collabrl.errors import UserError
from collabrl.tools.corpus import REPOS, build_corpus, documents, split_words


def test_windows_overlap_by_the_given_number_of_words() -> None:
    text = "w1 w2 w3 w4 w5\nw6 w7\n\nw8 w9"

    windows = split_words(text, chunk_words=4, overlap_words=1)

    assert [w[2].split() for w in windows] == [
        ["w1", "w2", "w3", "w4"],
        ["w4", "w5", "w6", "w7"],
        ["w7", "w8", "w9"],
    ]
    assert [(w[0], w[1]) for w in windows] == [(1, 1), (1, 2), (2, 4)]
    assert windows[1][2] == "w4 w5\nw6 w7"  # the original slice: line breaks kept


def test_no_window_repeats_only_words_the_previous_one_had() -> None:
    assert len(split_words("a b c d e f", chunk_words=4, overlap_words=2)) == 2
    assert len(split_words("a b c", chunk_words=4, overlap_words=2)) == 1
    assert split_words(" \n ", chunk_words=4, overlap_words=2) == []


@pytest.mark.parametrize(("words", "overlap"), [(0, 0), (4, 4), (4, -1)])
def test_impossible_chunking_is_a_user_error(words: int, overlap: int) -> None:
    with pytest.raises(UserError, match="bad chunking"):
        split_words("a b c", words, overlap)


def test_fractions_has_its_pydoc_page_and_its_source() -> None:
    docs = dict(documents("fractions"))

    assert set(docs) == {"pydoc:fractions", "fractions.py"}
    assert "limit_denominator" in docs["pydoc:fractions"]
    assert "def limit_denominator" in docs["fractions.py"]


@pytest.mark.parametrize(("repo", "member"), [("itertools", "combinations"), ("cmath", "phase")])
def test_c_modules_are_documented_by_pydoc_alone(repo: str, member: str) -> None:
    chunks = build_corpus(repo, chunk_words=200, overlap_words=50)

    assert {c.source for c in chunks} == {f"pydoc:{repo}"}
    assert any(member in c.text for c in chunks)
    assert all(c.repo == repo and c.module == repo for c in chunks)


def test_numpy_corpus_is_source_without_tests() -> None:
    sources = {source for source, _ in documents("numpy")}

    assert "numpy/linalg/_linalg.py" in sources
    assert not any("/tests/" in s for s in sources)
    assert not any("LICENSE" in s for s in sources)


def test_an_unknown_repo_is_a_user_error() -> None:
    assert "networkx" not in REPOS
    with pytest.raises(UserError, match="sympy, scipy, numpy, math, cmath, fractions, itertools"):
        build_corpus("networkx", 200, 50)
