"""Multi-round, multi-model solution evolution (AlphaApollo's evolving map).

K models propose candidates for every problem, round after round; each candidate is
checked (its code re-run in the sandbox, reviews by other models) and scored, and
all of it lands in a shared state that the next round's prompts read.
`runner.run_evolve` drives it; docs/evolve.md describes the algorithm.
"""

from collabrl.evolve.config import EvolveConfig
from collabrl.evolve.runner import EvolveResult, run_evolve

__all__ = ["EvolveConfig", "EvolveResult", "run_evolve"]
