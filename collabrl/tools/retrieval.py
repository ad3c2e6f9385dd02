"""AlphaApollo's `retrieve` tool: query rewriter → document retriever → result summariser.

The main model asks about a library in its own words ("how do I solve x**2 - 2 = 0
with sympy"); a helper model rewrites that into a general, searchable question, the
repo's index returns the top-k chunks, and the same helper distils them into
callable names, arguments and a short example (§2.3, prompts from appendix A.3).
With no helper model, or with `raw`, the tool returns the chunks themselves with
their sources, and makes no model call at all.

The text extraction of the paper lost the tool's name and the opening sentence of
both prompts: the openings below are ours, every numbered rule is the paper's.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from collabrl.config import EngineConfig, option
from collabrl.engines import create_engine, is_url
from collabrl.engines.base import Engine, SamplingParams
from collabrl.errors import UserError
from collabrl.tools.base import ToolResult, ToolSpec, bad_arguments
from collabrl.tools.corpus import REPOS, Chunk, check_chunking
from collabrl.tools.index import BACKENDS, Index, load_index

MAX_TOP_K = 10  # more chunks than this only dilutes the summary and the context
# A rewrite is "a single concise question": a short cap stops a rambling helper early.
REWRITE_MAX_TOKENS = 96

REWRITE_PROMPT = """\
Rewrite the following question about a Python library into a general question for \
searching the library's documentation.
Question: {query}
Rules:
(1) Keep only: task category and the library/tool name if present.
(2) Do NOT include any specific objects/structures, numbers, variable names, operators, \
or concrete equation forms.
(3) Return a single concise question text (no preamble), or empty if the original is \
already short, clear, and general.
Return ONLY the question text or empty."""

SUMMARY_PROMPT = """\
Documentation of the Python library {repo}:

{context}

Question: {query}
Answer the question from the documentation above with a concise answer that:
(1) includes fully-qualified function or class names when possible (e.g., \
sympy.core.function.diff);
(2) includes brief, runnable usage examples;
(3) NEVER mentions files, tests, sources, or ’documents’, and avoids any meta \
commentary about what the docs do or do not contain;
(4) may rely on general knowledge beyond the docs to help the user.
Return ONLY the answer text (no preamble) or empty."""

SPEC = ToolSpec(
    name="retrieve",
    description=(
        "Search the documentation and source code of a Python library for function "
        "interfaces, usage and examples.\n"
        "Returns:\n"
        "    str: The query result, including relevant code examples, descriptions, "
        "and usage.\n"
        "metadata:\n"
        '    "limitations": 1) "Not suitable for solving specific math problems."\n'
        '    "best_practices": 1) "Ask for usage instructions or examples for a specific '
        'function interface whenever possible."'
    ),
    parameters={
        "type": "object",
        "properties": {
            "repo_name": {
                "type": "string",
                "enum": list(REPOS),
                "description": f"One of [{', '.join(REPOS)}]",
            },
            "query": {
                "type": "string",
                "description": "Natural-language query for retrieval, e.g., ‘Function "
                "interface and examples of calling sympy to solve nonlinear equations’",
            },
            "top_k": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TOP_K,
                "description": "Number of documents to return per sub-query (default: 3)",
            },
        },
        "required": ["repo_name", "query"],
        "additionalProperties": False,
    },
)


@dataclass
class RetrievalConfig:
    """The retrieve tool: its index and the model that rewrites and summarises."""

    backend: str = option("bm25", f"Index backend: {' | '.join(BACKENDS)}.")
    model: str | None = option(
        None,
        "Rewriter and summariser: a model reference or an OpenAI-compatible base URL; "
        "none returns the raw chunks.",
    )
    raw: bool = option(False, "Return the retrieved chunks with their sources, no model calls.")
    top_k: int = option(3, "Chunks retrieved when the call does not say (the paper's default).")
    chunk_words: int = option(200, "Words per chunk of the corpus.")
    overlap_words: int = option(50, "Words a chunk shares with the previous one.")
    max_tokens: int = option(512, "Longest summary, in tokens.")
    engine: EngineConfig = option(EngineConfig(), "Engine of the rewriter/summariser model.")

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise UserError(
                f"unknown retrieval backend '{self.backend}'", f"use one of {', '.join(BACKENDS)}"
            )
        if not 1 <= self.top_k <= MAX_TOP_K:
            raise UserError(f"retrieval top_k {self.top_k} is out of range", f"use 1..{MAX_TOP_K}")
        check_chunking(self.chunk_words, self.overlap_words)


class RetrievalTool:
    """The `retrieve` tool; safe to call from several threads at once."""

    spec = SPEC

    def __init__(self, config: RetrievalConfig, engine: Engine | None = None) -> None:
        config.check()
        self.config = config
        self.engine = engine
        self.params = SamplingParams(max_tokens=config.max_tokens, temperature=0.0)
        self._indexes: dict[str, Index] = {}
        # One lock per repo: the first call builds or loads its index (seconds), and a
        # call to another repo need not wait for it.
        self._loading = {repo: threading.Lock() for repo in REPOS}
        # A local engine runs one generation at a time; an HTTP endpoint takes many.
        local = engine is not None and not (config.model and is_url(config.model))
        self._generating: AbstractContextManager = threading.Lock() if local else nullcontext()

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        checked = self._check(arguments)
        if isinstance(checked, ToolResult):
            return checked
        repo, query, top_k = checked
        raw = self.config.raw or self.engine is None
        searched = query if raw else self._rewrite(query)
        chunks = self.index(repo).search(searched, top_k)
        if not chunks and searched != query:  # a rewrite that matches nothing is no help
            searched, chunks = query, self.index(repo).search(query, top_k)
        meta = {"repo": repo, "query": searched, "sources": [c.cite() for c in chunks]}
        if not chunks:
            return ToolResult(f"No documentation of {repo} matches '{query}'.", meta=meta)
        summary = "" if raw else self._summarise(repo, query, chunks)
        meta["summarised"] = bool(summary)
        return ToolResult(summary or format_chunks(chunks), meta=meta)

    def index(self, repo: str) -> Index:
        with self._loading[repo]:
            if repo not in self._indexes:
                cfg = self.config
                self._indexes[repo] = load_index(
                    repo, cfg.backend, cfg.chunk_words, cfg.overlap_words
                )
            return self._indexes[repo]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def _check(self, arguments: Any) -> tuple[str, str, int] | ToolResult:
        """(repo, query, top_k), or the bad_arguments result the model reads."""
        if not isinstance(arguments, dict):
            return bad_arguments(SPEC, "arguments must be an object with repo_name and query")
        unknown = set(arguments) - set(SPEC.parameters["properties"])
        if unknown:
            return bad_arguments(
                SPEC, f"unknown argument(s) {sorted(unknown)}; use repo_name, query, top_k"
            )
        repo = arguments.get("repo_name")
        if repo not in REPOS:
            return bad_arguments(SPEC, f"repo_name {repo!r} is not one of [{', '.join(REPOS)}]")
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return bad_arguments(SPEC, "query must be a non-empty string")
        top_k = arguments.get("top_k", self.config.top_k)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
            return bad_arguments(SPEC, f"top_k must be an integer from 1 to {MAX_TOP_K}")
        return repo, query.strip(), top_k

    def _rewrite(self, query: str) -> str:
        """The rewriter's question; the original when it answers empty (rule 3)."""
        params = SamplingParams(max_tokens=REWRITE_MAX_TOKENS, temperature=0.0)
        return self._ask(REWRITE_PROMPT.format(query=query), params) or query

    def _summarise(self, repo: str, query: str, chunks: list[Chunk]) -> str:
        context = "\n\n".join(f"[{chunk.module}]\n{chunk.text}" for chunk in chunks)
        prompt = SUMMARY_PROMPT.format(repo=repo, context=context, query=query)
        return self._ask(prompt, self.params)

    def _ask(self, prompt: str, params: SamplingParams) -> str:
        """The helper model's reply, "" for an empty one ("or empty" in both prompts)."""
        with self._generating:
            reply = self.engine.generate([[{"role": "user", "content": prompt}]], params)
        text = reply[0][0].text.strip()
        return "" if text.strip("\"'`.").lower() in ("", "empty") else text


def format_chunks(chunks: list[Chunk]) -> str:
    """Raw chunks, numbered and cited, for the model to read itself."""
    return "\n\n".join(
        f"[{rank}] {chunk.cite()}\n{chunk.text}" for rank, chunk in enumerate(chunks, 1)
    )


def build_retrieval_tool(config: RetrievalConfig) -> RetrievalTool:
    """The tool with its helper model loaded, unless it runs raw."""
    config.check()
    wants_model = config.model is not None and not config.raw
    engine = create_engine(config.model, config.engine) if wants_model else None
    return RetrievalTool(config, engine)
