"""`SamplingParams`' per-prompt seeds and budgets, and the helpers that batch calls."""

from __future__ import annotations

import dataclasses

import pytest

from collabrl.engines.base import SamplingParams

HOT = SamplingParams(max_tokens=8, temperature=0.9, seed=3, stop=("\n",))


def test_each_prompt_gets_its_own_budget_or_max_tokens() -> None:
    params = SamplingParams(max_tokens=50, budgets=(3, 9))
    assert [params.prompt_budget(i) for i in range(2)] == [3, 9]
    assert [SamplingParams(max_tokens=50).prompt_budget(i) for i in range(3)] == [50] * 3


@pytest.mark.parametrize("budgets", [(0,), (4, -1)])
def test_budgets_must_be_positive(budgets: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="budgets must all be >= 1"):
        SamplingParams(budgets=budgets)


def test_budgets_must_match_the_batch_when_checked() -> None:
    params = SamplingParams(budgets=(3, 9))
    params.check_budgets(2)
    SamplingParams().check_budgets(5)  # no budgets of its own: any batch
    with pytest.raises(ValueError, match="budgets: one per prompt, got 2 for 3"):
        params.check_budgets(3)


def test_for_prompt_keeps_one_prompts_seed_and_budget() -> None:
    batch = dataclasses.replace(HOT, budgets=(4, 6), seeds=(10, 20))
    assert batch.for_prompt(1) == dataclasses.replace(HOT, max_tokens=6, seed=20)
    # Without seeds and budgets of its own, prompt i gets seed + i and max_tokens.
    assert HOT.for_prompt(2) == dataclasses.replace(HOT, seed=5)
    unseeded = SamplingParams(max_tokens=8)
    assert unseeded.for_prompt(4) == unseeded


def test_the_batch_key_ignores_budget_and_seed_but_not_whether_seeded() -> None:
    key = HOT.batch_key()
    assert dataclasses.replace(HOT, max_tokens=2, seed=99).batch_key() == key
    assert dataclasses.replace(HOT, seed=None, seeds=(4,)).batch_key() == key
    assert dataclasses.replace(HOT, budgets=(1, 2), seeds=(4, 5)).batch_key() == key
    assert dataclasses.replace(HOT, seed=None).batch_key() != key  # unseeded
    for change in ({"temperature": 1.0}, {"stop": ()}, {"n": 2}, {"logprobs": True}):
        assert dataclasses.replace(HOT, **change).batch_key() != key
    assert len({key, HOT.batch_key()}) == 1  # hashable: a dict key


def test_merge_keeps_each_calls_seed_and_budget() -> None:
    calls = [dataclasses.replace(HOT, max_tokens=b, seed=s) for b, s in [(2, 7), (9, 1), (2, 4)]]
    merged = SamplingParams.merge(calls)
    assert merged.budgets == (2, 9, 2) and merged.seeds == (7, 1, 4)
    assert merged.max_tokens == 9  # the largest, for anything that reads one bound
    assert merged.batch_key() == HOT.batch_key()
    # The merged batch's prompts are the calls again.
    assert [merged.for_prompt(i) for i in range(3)] == calls


def test_merge_of_equal_budgets_asks_max_tokens_and_unseeded_calls_get_no_seeds() -> None:
    same = [dataclasses.replace(HOT, seed=s) for s in (5, 6)]
    merged = SamplingParams.merge(same)
    assert (merged.max_tokens, merged.budgets, merged.seeds) == (8, (), (5, 6))
    greedy = [SamplingParams(max_tokens=b) for b in (3, 3, 1)]
    merged = SamplingParams.merge(greedy)
    assert (merged.budgets, merged.seed, merged.seeds) == ((3, 3, 1), None, ())


def test_merge_refuses_calls_that_cannot_share_a_batch() -> None:
    with pytest.raises(ValueError, match="differ in more than budget and seed"):
        SamplingParams.merge([HOT, dataclasses.replace(HOT, temperature=0.1)])
    with pytest.raises(ValueError, match="differ in more than budget and seed"):
        SamplingParams.merge([HOT, dataclasses.replace(HOT, seed=None)])
    with pytest.raises(ValueError, match="budgets: one per prompt"):
        SamplingParams.merge([dataclasses.replace(HOT, budgets=(1, 2))])
    with pytest.raises(ValueError, match="no params"):
        SamplingParams.merge([])
