"""The `retrieve` tool: argument checks, raw chunks, and the rewrite → summarise path."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from collabrl.engines.base import Completion, Engine, Prompt, SamplingParams
from collabrl.errors import UserError
from collabrl.tools.base import Tool
from collabrl.tools.retrieval import (
    REWRITE_PROMPT,
    SUMMARY_PROMPT,
    RetrievalConfig,
    RetrievalTool,
    build_retrieval_tool,
)

QUERY = {"repo_name": "fractions", "query": "closest fraction with denominator at most a maximum"}
# The numbered rules of appendix A.3, as the paper prints them.
REWRITER_RULES = [
    "(1) Keep only: task category and the library/tool name if present.",
    "(3) Return a single concise question text (no preamble), or empty if the original is "
    "already short, clear, and general.",
    "Return ONLY the question text or empty.",
]
SUMMARISER_RULES = [
    "(1) includes fully-qualified function or class names when possible (e.g., "
    "sympy.core.function.diff);",
    "(4) may rely on general knowledge beyond the docs to help the user.",
    "Return ONLY the answer text (no preamble) or empty.",
]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path))
    return tmp_path


class Recording:
    """An engine that keeps every prompt it is sent, and answers with `inner`, or with
    scripted replies where a case needs an answer no real model gives on demand."""

    name = "recording"

    def __init__(self, inner: Engine | None = None, replies: list[str] | None = None) -> None:
        self.inner = inner
        self.replies = list(replies or [])
        self.prompts: list[str] = []

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        self.prompts += [p[-1]["content"] for p in prompts]
        if self.inner is not None:
            return self.inner.generate(prompts, params)
        return [[Completion(self.replies.pop(0))] for _ in prompts]

    def close(self) -> None:
        pass


def test_the_spec_is_the_papers_retrieve_tool() -> None:
    tool: Tool = RetrievalTool(RetrievalConfig())
    schema = tool.spec.schema()["function"]

    assert schema["name"] == "retrieve"
    assert schema["parameters"]["required"] == ["repo_name", "query"]
    assert "Not suitable for solving specific math problems." in schema["description"]
    assert schema["parameters"]["properties"]["top_k"]["description"] == (
        "Number of documents to return per sub-query (default: 3)"
    )


def test_raw_mode_returns_cited_chunks_without_a_model() -> None:
    result = RetrievalTool(RetrievalConfig()).call({**QUERY, "top_k": 2})

    assert result.ok
    assert result.text.startswith("[1] ") and "\n\n[2] " in result.text
    assert "limit_denominator" in result.text
    assert len(result.meta["sources"]) == 2
    assert result.meta["sources"][0] in result.text
    assert result.meta["summarised"] is False


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"repo_name": "networkx", "query": "shortest path"}, "[sympy, scipy, numpy, math"),
        ({"repo_name": "math"}, "query must be a non-empty string"),
        ({"repo_name": "math", "query": "gcd", "top_k": 0}, "top_k must be an integer"),
        ({"repo_name": "math", "query": "gcd", "top_k": True}, "top_k must be an integer"),
        ({"repo_name": "math", "query": "gcd", "k": 3}, "unknown argument(s) ['k']"),
        (["math", "gcd"], "arguments must be an object"),
    ],
)
def test_bad_arguments_come_back_to_the_model(arguments, message: str) -> None:
    result = RetrievalTool(RetrievalConfig()).call(arguments)

    assert result.error == "bad_arguments"
    assert result.text.startswith("retrieve: ")
    assert message in result.text


def test_a_query_matching_nothing_says_so() -> None:
    result = RetrievalTool(RetrievalConfig()).call({"repo_name": "cmath", "query": "zzyzx"})

    assert result.ok and result.text == "No documentation of cmath matches 'zzyzx'."


def test_calls_from_many_threads_agree() -> None:
    tool = RetrievalTool(RetrievalConfig())
    queries = [{**QUERY, "repo_name": repo} for repo in ("fractions", "math", "cmath")] * 4

    with ThreadPoolExecutor(8) as pool:
        texts = [r.text for r in pool.map(tool.call, queries)]

    assert texts == [tool.call(q).text for q in queries]


def test_rewriter_and_summariser_get_the_papers_prompts(tiny_engine) -> None:
    engine = Recording(tiny_engine)
    tool = RetrievalTool(RetrievalConfig(max_tokens=16), engine)

    result = tool.call(QUERY)

    rewrite, summary = engine.prompts
    assert all(rule in rewrite for rule in REWRITER_RULES)
    assert QUERY["query"] in rewrite
    assert all(rule in summary for rule in SUMMARISER_RULES)
    assert "[fractions]\n" in summary  # each chunk is labelled with its module
    assert result.ok and result.meta["sources"]
    # The tiny random model says *something*: that text is the answer.
    assert result.meta["summarised"] and result.text.strip() and "[1] " not in result.text


def test_an_empty_rewrite_keeps_the_query_and_an_empty_summary_gives_the_chunks() -> None:
    engine = Recording(replies=["  empty ", ""])
    tool = RetrievalTool(RetrievalConfig(), engine)

    result = tool.call(QUERY)

    assert result.meta["query"] == QUERY["query"]
    assert result.meta["summarised"] is False
    assert result.text.startswith("[1] fractions") or result.text.startswith("[1] pydoc:")
    assert len(engine.prompts) == 2


def test_a_rewrite_that_matches_nothing_falls_back_to_the_query() -> None:
    engine = Recording(replies=["zzyzx qwxj", "Use fractions.Fraction.limit_denominator."])
    tool = RetrievalTool(RetrievalConfig(), engine)

    result = tool.call(QUERY)

    assert result.meta["query"] == QUERY["query"]
    assert result.text == "Use fractions.Fraction.limit_denominator."


def test_the_prompts_keep_every_surviving_line_of_the_paper() -> None:
    for rule in REWRITER_RULES:
        assert rule in REWRITE_PROMPT
    assert "NEVER mentions files, tests, sources, or ’documents’" in SUMMARY_PROMPT


def test_without_a_model_the_tool_is_raw_and_a_bad_config_is_refused() -> None:
    assert build_retrieval_tool(RetrievalConfig()).engine is None
    assert build_retrieval_tool(RetrievalConfig(model="smollm2-135m", raw=True)).engine is None
    with pytest.raises(UserError, match="unknown retrieval backend"):
        build_retrieval_tool(RetrievalConfig(backend="faiss"))
    with pytest.raises(UserError, match="bad chunking"):
        RetrievalConfig(chunk_words=50, overlap_words=50).check()


@pytest.mark.slow  # loads the real SmolLM2-135M-Instruct
def test_smollm2_rewrites_and_summarises() -> None:
    tool = build_retrieval_tool(RetrievalConfig(model="smollm2-135m", max_tokens=96))

    result = tool.call(QUERY)
    tool.close()

    assert result.ok and result.meta["sources"]
    assert result.meta["summarised"], result.text
