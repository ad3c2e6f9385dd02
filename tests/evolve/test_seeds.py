"""Evolve's proposals follow the one seed rule: a candidate (round, model, problem,
branch) is sampled with the same seed whatever else its model proposes with it."""

from __future__ import annotations

from collabrl.data.benchmarks import Item
from collabrl.data.prompts import get_prompt
from collabrl.evolve import EvolveConfig
from collabrl.evolve.runner import Proposer, _propose
from collabrl.evolve.verify import Reviewer
from collabrl.protocols.base import Policy
from collabrl.protocols.solo import SoloProtocol
from tests.protocols.test_base_seeds_budgets import SeedsByProblem

ITEMS = [Item(f"p{i}", f"Solve problem p{i}.", "42") for i in range(3)]


def proposal_seeds(tokenizer, branches: int, items: list[Item], round_no: int = 1) -> list[dict]:
    """The seeds each of two models' engines was sent, per problem, branch by branch."""
    engines = [SeedsByProblem(tokenizer, lambda prompt: "It is \\boxed{42}.") for _ in "ab"]
    proposers = [
        Proposer(
            name, SoloProtocol(Policy(e, tokenizer), get_prompt("plain"), ()), Reviewer(name, e)
        )
        for name, e in zip("ab", engines, strict=True)
    ]
    config = EvolveConfig(models=["a", "b"])
    config.sampling.n, config.sampling.max_tokens = branches, 32
    _propose(config, proposers, items, [], round_no)
    return [
        {problem: [seed for seed, _ in rows] for problem, rows in e.sent.items()} for e in engines
    ]


def test_a_candidates_seed_is_its_own_whatever_its_batch(smol_tokenizer) -> None:
    two = proposal_seeds(smol_tokenizer, 2, ITEMS)
    # p1 alone, with a third branch: its first two branches sample as before, both models.
    three = proposal_seeds(smol_tokenizer, 3, ITEMS[1:2])
    for model in (0, 1):
        assert three[model]["p1"][:2] == two[model]["p1"]
    every = [seed for seeds in two for rows in seeds.values() for seed in rows]
    assert None not in every and len(set(every)) == len(every) == 2 * 3 * 2
    # Another round samples apart.
    later = proposal_seeds(smol_tokenizer, 2, ITEMS, round_no=2)
    assert not set(every) & {seed for seeds in later for rows in seeds.values() for seed in rows}
