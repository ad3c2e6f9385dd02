"""Seeds of a protocol's random streams: one per episode, round and author.

Every process derives the same seed for the same episode (hashed, not `hash()`), so a
sample's text does not depend on which batch or rank it ran in.
"""

from __future__ import annotations

import dataclasses
import hashlib

from collabrl.engines.base import SamplingParams
from collabrl.episode import Episode

# Random streams of one episode's round: the policy, a planner, its collaborators.
POLICY_STREAM, PLANNER_STREAM, COLLABORATOR_STREAM = 0, 1, 2


def episode_seed(
    params: SamplingParams, episode: Episode, round_no: int, stream: int = POLICY_STREAM
) -> int | None:
    """The seed of one episode's round, from the run's seed (a trainer folds its step
    in), the problem, the sample index, the round and the random stream.

    vLLM and servers seed each request on its own, so a seed shared by a batch would
    make the samples of one problem identical (all GRPO advantages 0). Hashed, so every
    process derives the same seed for the same episode, whatever batch it is in.
    """
    if params.seed is None:
        return None
    return hashed_seed(
        params.seed, episode.problem_id, episode.meta.get("sample", 0), round_no, stream
    )


def collaborator_seeds(
    params: SamplingParams, episode: Episode, round_no: int, calls: int
) -> tuple[int, ...]:
    """The seeds of an episode's `calls` collaborator calls in one round (a teacher's
    one, an expert panel's K): from its COLLABORATOR_STREAM seed and each call's place
    among the episode's own calls, so that K experts asked alike do not answer alike,
    whatever else is in the round. Empty when the run is unseeded."""
    seed = episode_seed(params, episode, round_no, COLLABORATOR_STREAM)
    if seed is None:
        return ()
    return tuple(hashed_seed(seed, call) for call in range(calls))


def hashed_seed(seed: int, *key: object) -> int:
    """A seed for what `key` names, drawn from `seed`: the same in every process (unlike
    `hash()`), in [0, 2**31) as vLLM and servers take it."""
    text = "/".join(map(str, (seed, *key)))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big") >> 1


def episode_seeds(
    params: SamplingParams, episodes: list[Episode], round_no: int, stream: int = POLICY_STREAM
) -> tuple[int, ...]:
    """`episode_seed` of every episode, in order; empty when the run is unseeded."""
    if params.seed is None:
        return ()
    return tuple(episode_seed(params, e, round_no, stream) for e in episodes)  # type: ignore[misc]


def round_params(
    params: SamplingParams, episodes: list[Episode], round_no: int, **changes: object
) -> SamplingParams:
    """The sampling params of the policy's round `round_no` in `episodes`: one sample
    each, each seeded by its own episode (`episode_seeds`), whatever its batch."""
    seeds = episode_seeds(params, episodes, round_no)
    return dataclasses.replace(params, n=1, seeds=seeds, **changes)
