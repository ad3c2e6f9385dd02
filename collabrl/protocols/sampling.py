"""Run a protocol over units of work (a problem and which of its samples) in fixed
chunks: how `collab eval` and the data builders sample.

Every chunk runs with the run's seed, and the protocol seeds each episode by its own
problem and sample (`protocols.seeds.episode_seed`), so a unit's seeds are the same
whatever chunk it is in. Chunk boundaries are fixed over the whole list of units; a
chunk partly done is sampled again whole, and only its missing units are handed back,
so a run interrupted and resumed samples exactly what an uninterrupted one does (with
the same engine and batch size).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from collabrl.data.benchmarks import Item
from collabrl.engines.base import SamplingParams
from collabrl.episode import Episode
from collabrl.protocols.base import CollabProtocol, Task


@dataclass(frozen=True)
class Unit:
    """One response to sample: the problem and which of its samples."""

    item: Item
    sample: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.item.id, self.sample)

    def task(self) -> Task:
        """The protocol's task; the reference only reaches the `reference` stand-in."""
        return Task(self.item.id, self.item.problem, self.sample, self.item.reference)


def units_of(items: list[Item], per_item: int) -> list[Unit]:
    """`per_item` units per problem, problem by problem."""
    return [Unit(item, s) for item in items for s in range(per_item)]


def sample_chunks(
    protocol: CollabProtocol,
    units: list[Unit],
    chunk: int,
    params: SamplingParams,
    done: Collection[tuple[str, int]] = frozenset(),
) -> Iterator[list[tuple[Unit, Episode]]]:
    """The episodes of the units not in `done`, one chunk at a time, in order."""
    for start in range(0, len(units), chunk):
        members = units[start : start + chunk]
        if all(u.key in done for u in members):
            continue
        episodes = protocol.run([u.task() for u in members], params)
        yield [(u, e) for u, e in zip(members, episodes, strict=True) if u.key not in done]
