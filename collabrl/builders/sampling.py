"""Write what a builder's sampled units become: a training row each, or the reason it
gave none. The units are sampled by `protocols/sampling.py`, in fixed seeded chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from collabrl import runs
from collabrl.builders.folder import BuildFolder
from collabrl.episode import Episode
from collabrl.protocols.sampling import Unit

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
