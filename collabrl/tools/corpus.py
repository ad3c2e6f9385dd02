"""What the `retrieve` tool searches: library source and docs, cut into overlapped chunks.

AlphaApollo (§2.3) indexes "the source code of a Python library and its associated
documentation", split by a fixed-length sliding window whose neighbours overlap so
that a sentence cut at one chunk's edge is whole in the next. Everything here is read
from what is installed, offline:

- sympy, scipy, numpy: the package's `.py` files (their docstrings *are* the API
  docs) and the documentation files it ships, minus test suites and build helpers;
- math, cmath, fractions, itertools: pydoc's plain-text page of the module (every
  public member's signature and docstring; math, cmath and itertools are C modules
  with no source), and for pure-Python fractions its source as well.
"""

from __future__ import annotations

import bisect
import importlib
import importlib.metadata
import platform
import pydoc
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from collabrl.errors import UserError

PACKAGES = ("sympy", "scipy", "numpy")
STDLIB = ("math", "cmath", "fractions", "itertools")
REPOS = PACKAGES + STDLIB

# Test suites, build/packaging helpers and scipy's private utility package (vendored
# array-API code, optimiser back-ends): text a caller of the library never reads.
_SKIPPED_DIRS = {"tests", "testing", "benchmarks", "_build_utils", "_pyinstaller", "_lib"}
_DOC_SUFFIXES = {".rst", ".md", ".txt"}
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Chunk:
    """A window of one document, with where it came from so an answer can cite it."""

    repo: str
    source: str  # file path inside the package, or "pydoc:<module>"
    start_line: int  # 1-based, inclusive
    end_line: int
    text: str

    def cite(self) -> str:
        return f"{self.source}:{self.start_line}-{self.end_line}"

    @property
    def module(self) -> str:
        """The dotted module the text documents (`sympy.solvers.solveset`, `math`), which
        lets a summary name functions fully qualified."""
        if self.source.startswith("pydoc:"):
            return self.source.removeprefix("pydoc:")
        return self.source.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".")


def check_repo(repo: str) -> None:
    """Refuse a repo the corpus cannot be built for (an operator's mistake)."""
    if repo not in REPOS:
        raise UserError(f"unknown repo '{repo}'", f"use one of {', '.join(REPOS)}")


def check_chunking(chunk_words: int, overlap_words: int) -> None:
    if chunk_words < 1 or not 0 <= overlap_words < chunk_words:
        raise UserError(
            f"bad chunking: {chunk_words} words with {overlap_words} overlap",
            "use chunk_words >= 1 and 0 <= overlap_words < chunk_words",
        )


def repo_version(repo: str) -> str:
    """The version the repo's text comes from: an index built from another is stale."""
    check_repo(repo)
    if repo in PACKAGES:
        return importlib.metadata.version(repo)
    return f"python-{platform.python_version()}"  # pydoc pages and stdlib source


def documents(repo: str) -> Iterator[tuple[str, str]]:
    """Every (source name, text) document of a repo."""
    check_repo(repo)
    module = importlib.import_module(repo)
    if repo in STDLIB:
        yield f"pydoc:{repo}", pydoc.render_doc(module, renderer=pydoc.plaintext)
        if getattr(module, "__file__", "").endswith(".py"):  # C modules have no source
            yield f"{repo}.py", Path(module.__file__).read_text(encoding="utf-8")
        return
    root = Path(module.__file__).parent
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root.parent)
        if _SKIPPED_DIRS.intersection(relative.parts[:-1]) or not _is_document(path):
            continue
        yield relative.as_posix(), path.read_text(encoding="utf-8", errors="replace")


def _is_document(path: Path) -> bool:
    if path.suffix == ".py":
        return True
    # Licences ship as .txt/.md too, and say nothing about the API.
    return path.suffix in _DOC_SUFFIXES and not path.stem.upper().startswith(("LICENSE", "COPYING"))


def split_words(text: str, chunk_words: int, overlap_words: int) -> list[tuple[int, int, str]]:
    """Cut `text` into windows of `chunk_words` words, each sharing `overlap_words`
    with the previous one; returns (start_line, end_line, text) per window.

    A window's text is the original slice from its first to its last word, so code
    keeps its line breaks and indentation. The last window may be shorter, but no
    window holds only words the previous one already had.
    """
    check_chunking(chunk_words, overlap_words)
    spans = [match.span() for match in _WORD.finditer(text)]
    if not spans:
        return []
    newlines = [match.start() for match in re.finditer("\n", text)]
    step = chunk_words - overlap_words
    windows = []
    for first in range(0, max(len(spans) - overlap_words, 1), step):
        window = spans[first : first + chunk_words]
        start, end = window[0][0], window[-1][1]
        # Line of an offset = newlines before it + 1.
        start_line = bisect.bisect_left(newlines, start) + 1
        end_line = bisect.bisect_left(newlines, end - 1) + 1
        windows.append((start_line, end_line, text[start:end]))
    return windows


def build_corpus(repo: str, chunk_words: int, overlap_words: int) -> list[Chunk]:
    """All chunks of a repo, in a stable order (documents sorted by path)."""
    return [
        Chunk(repo, source, start, end, text)
        for source, document in documents(repo)
        for start, end, text in split_words(document, chunk_words, overlap_words)
    ]
