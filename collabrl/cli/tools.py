"""`collab tools index|retrieve`: build the retrieval indexes, and ask the retrieve tool by hand."""

from __future__ import annotations

import typer
from rich.table import Table

from collabrl.cli.console import make_console
from collabrl.tools.retrieval import RetrievalConfig

app = typer.Typer(help="The tools of the apollo protocol, run by hand.", no_args_is_help=True)
console = make_console()
DEFAULTS = RetrievalConfig()

BACKEND = typer.Option(DEFAULTS.backend, "--backend", help="bm25 (no model) or minilm (dense).")
CHUNK_WORDS = typer.Option(DEFAULTS.chunk_words, "--chunk-words", help="Words per chunk.")
OVERLAP_WORDS = typer.Option(
    DEFAULTS.overlap_words, "--overlap-words", help="Words a chunk shares with the previous one."
)


@app.command("index")
def index(
    repo: list[str] = typer.Option(
        None, "--repo", help="Repo to index (repeatable; default: all)."
    ),
    backend: str = BACKEND,
    chunk_words: int = CHUNK_WORDS,
    overlap_words: int = OVERLAP_WORDS,
    rebuild: bool = typer.Option(False, "--rebuild", help="Rebuild even a fresh index."),
) -> None:
    """Build the indexes that are missing or stale, and print their sizes and build times."""
    from collabrl.tools.corpus import REPOS, check_chunking, check_repo
    from collabrl.tools.index import ensure_index, identity, index_dir

    repos = repo or list(REPOS)
    check_chunking(chunk_words, overlap_words)
    for name in repos:  # every name before the first (minutes-long) build
        check_repo(name)
        identity(name, backend, chunk_words, overlap_words)
    table = Table("repo", "version", "chunks", "MB", "build s", "", title=f"{backend} indexes")
    for name in repos:
        meta = ensure_index(name, backend, chunk_words, overlap_words, rebuild=rebuild)
        table.add_row(
            name,
            meta["version"],
            str(meta["chunks"]),
            f"{meta['bytes'] / 1e6:.1f}",
            f"{meta['build_seconds']:.1f}",
            "built" if meta["built"] else "fresh",
        )
    console.print(table)
    console.print(f"indexes in {index_dir(backend, repos[0]).parent}")


@app.command("retrieve")
def retrieve(
    repo: str = typer.Argument(..., help="sympy, scipy, numpy, math, cmath, fractions, itertools."),
    query: str = typer.Argument(..., help="What to look up, in plain words."),
    top_k: int = typer.Option(DEFAULTS.top_k, "--top-k", help="Chunks to retrieve."),
    raw: bool = typer.Option(False, "--raw", help="Print the chunks, no rewrite or summary."),
    model: str = typer.Option(
        None, "--model", "-m", help="Rewriter/summariser: model reference or base URL."
    ),
    backend: str = BACKEND,
    chunk_words: int = CHUNK_WORDS,
    overlap_words: int = OVERLAP_WORDS,
) -> None:
    """Print the retrieve tool's answer to QUERY about REPO."""
    from collabrl.errors import UserError
    from collabrl.tools.retrieval import build_retrieval_tool

    config = RetrievalConfig(
        backend=backend,
        model=model,
        raw=raw,
        chunk_words=chunk_words,
        overlap_words=overlap_words,
    )
    tool = build_retrieval_tool(config)
    try:
        result = tool.call({"repo_name": repo, "query": query, "top_k": top_k})
    finally:
        tool.close()
    if result.error:
        raise UserError(result.text, "see `collab tools retrieve --help`")
    if not raw and model is not None:
        console.print(f"[dim]searched: {result.meta['query']}[/]", highlight=False)
    print(result.text)
