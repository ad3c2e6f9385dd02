"""`protocols/collaborators.py`: how every collaborator's calls are sampled."""

from __future__ import annotations

import pytest

from collabrl.protocols.collaborators import collaborator_params


def test_each_call_keeps_its_seed_and_budget_and_nothing_of_the_policys() -> None:
    asked = collaborator_params((11, 12, 13), [8, 32, 8], temperature=0.7, top_p=0.9, top_k=20)
    assert asked.seeds == (11, 12, 13)
    assert (asked.max_tokens, asked.budgets) == (32, (8, 32, 8))
    assert (asked.temperature, asked.top_p, asked.top_k, asked.n) == (0.7, 0.9, 20, 1)
    # A collaborator writes plain text: the policy's stops, bans and log-probs stay home.
    assert (asked.stop, asked.banned, asked.logprobs, asked.include_stop) == ((), (), False, False)


def test_a_uniform_batch_stays_one_shape() -> None:
    asked = collaborator_params((1, 2), [64, 64], temperature=0.0)
    assert (asked.max_tokens, asked.budgets) == (64, ())


def test_a_batch_without_calls_is_a_callers_bug() -> None:
    with pytest.raises(ValueError, match="budget"):
        collaborator_params((), [], temperature=0.0)
