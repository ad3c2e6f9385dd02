"""`Policy.continue_`: one batch, every row within its own token budget."""

from __future__ import annotations

from pathlib import Path

from collabrl.engines.base import SamplingParams
from collabrl.engines.openai_http import OpenAIEngine
from collabrl.protocols.base import Policy
from tests.conftest import write_tiny_llama
from tests.servers import ServerProcess

CONTEXT = 64  # the served model's whole context, prompt and completion together


def test_each_row_asks_a_tight_server_for_its_own_budget(smol_tokenizer, tmp_path: Path) -> None:
    """A long context with a small budget beside a short one with a large budget: asked
    for the largest budget, the long row overflows the server's context and the real
    embedded server refuses the whole batch with a 400; asked for its own, both fit."""
    folder = write_tiny_llama(smol_tokenizer, tmp_path / "tight", max_position_embeddings=CONTEXT)
    long_row, short_row = list(range(100, 150)), list(range(100, 105))
    budgets = [CONTEXT - len(long_row) - 2, CONTEXT - len(short_row) - 2]  # 12 and 57
    with ServerProcess(folder, role="policy") as server:
        policy = Policy(OpenAIEngine(server.url), smol_tokenizer)
        try:
            params = SamplingParams(temperature=1.0, seed=0).with_budgets(budgets)
            segments = policy.continue_([long_row, short_row], params)
        finally:
            policy.close()
    assert [len(s.token_ids) <= b for s, b in zip(segments, budgets, strict=True)] == [True, True]
    assert all(s.token_ids for s in segments)
