"""The response cache's keys."""

from __future__ import annotations

import dataclasses

from collabrl.engines.base import SamplingParams
from collabrl.engines.response_cache import ResponseCache

MODEL = {"ref": "m", "served_model": None}


def test_keys_written_before_per_prompt_budgets_still_hit() -> None:
    """One prompt's params (no `budgets`) key as they did before the field existed."""
    assert ResponseCache.key(MODEL, "p", SamplingParams(max_tokens=8)) == (
        "dbd8c8296fae5e73a90a01b457704ed44b1b4b67e28f817c380f0ff226169853"
    )
    seeded = SamplingParams(max_tokens=5, temperature=1.0, seed=7, stop=("x",))
    assert ResponseCache.key(MODEL, "p", seeded) == (
        "8dadc063ba1dfb232b506487a5305842bc1feae221b6b5fb9c5481b1e3314fc6"
    )


def test_a_calls_own_budget_and_seed_are_in_its_key() -> None:
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=7)
    keys = {
        ResponseCache.key(MODEL, "p", p)
        for p in (
            params,
            dataclasses.replace(params, max_tokens=6),
            dataclasses.replace(params, seed=8),
            dataclasses.replace(params, budgets=(6,)),
        )
    }
    assert len(keys) == 4
