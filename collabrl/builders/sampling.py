"""Sample a policy over units of work in fixed, seeded chunks, and write what comes out.

Chunk boundaries are fixed over the whole list of units and chunk c is sampled with
seed `seed + start of c`, so a build interrupted and resumed samples exactly what an
uninterrupted one does (with the same engine and batch size): a chunk partly done is
sampled again whole, and only its missing units are handed back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from collabrl import runs
from collabrl.builders.folder import BuildFolder
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


def units_of(items: list[Item], per_item: int) -> list[Unit]:
    """`per_item` units per problem, problem by problem."""
    return [Unit(item, s) for item in items for s in range(per_item)]


def sample_missing(
    protocol: CollabProtocol,
    units: list[Unit],
    done: set[tuple[str, int]],
    chunk: int,
    params: SamplingParams,
) -> Iterator[list[tuple[Unit, Episode]]]:
    """The episodes of the units not in `done`, one chunk at a time, in order."""
    for start in range(0, len(units), chunk):
        members = units[start : start + chunk]
        if all(u.key in done for u in members):
            continue
        tasks = [Task(u.item.id, u.item.problem, u.sample) for u in members]
        seed = None if params.seed is None else params.seed + start
        episodes = protocol.run(tasks, dataclasses.replace(params, seed=seed))
        yield [(u, e) for u, e in zip(members, episodes, strict=True) if u.key not in done]


# What a unit becomes: a training row, or the reason it gave none.
MakeRow = Callable[[Unit, Episode], "dict[str, Any] | str"]


def write_rows(
    folder: BuildFolder,
    batches: Iterator[list[tuple[Unit, Episode]]],
    make_row: MakeRow,
    progress: Callable[[int, int], None] | None,
    todo: int,
    rows_wanted: int | None = None,
) -> None:
    """Turn each sampled unit into a row or a rejection, appended as it comes.

    Stops once the folder holds `rows_wanted` rows (None: when the units run out);
    progress then counts rows against it, otherwise units against `todo`.
    """
    rows = len(folder.rows())
    finished = 0
    with (
        runs.RecordWriter(folder.rows_path) as row_file,
        runs.RecordWriter(folder.rejected_path) as rejects,
    ):
        for batch in batches:
            for unit, episode in batch:
                key = {"item_id": unit.item.id, "sample": unit.sample}
                if rows_wanted is not None and rows >= rows_wanted:
                    return
                made = make_row(unit, episode)
                if isinstance(made, str):
                    rejects.write({**key, "reason": made})
                else:
                    row_file.write({**made, **key})
                    rows += 1
            finished += len(batch)
            if progress:
                progress(finished, todo) if rows_wanted is None else progress(rows, rows_wanted)
            if rows_wanted is not None and rows >= rows_wanted:
                return
