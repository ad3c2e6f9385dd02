"""A builder's output folder, written as the job goes and resumable after `kill -9`.

    config.yaml     the resolved config; a re-run with another experiment is refused
    rows.jsonl      the training rows, appended (and flushed) one unit of work at a time
    rejected.jsonl  units that gave no row, each with its reason
    dataset/        rows.jsonl as a `datasets` folder (`datasets.load_from_disk`)
    stats.json      what was built: counts, rejection reasons, histograms' numbers
    stats.png       the same, drawn

A unit of work (one sampled response, or one problem) lands in exactly one of
rows.jsonl and rejected.jsonl, in one line, so a resumed job skips exactly the
units already done and loses at most the ones in flight.

Rows are what TRL's `SFTTrainer` takes as they are: a conversational `prompt` (the
messages before the answer) and `completion` (the assistant message), with
bookkeeping columns beside them, which the trainer drops (`remove_unused_columns`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.builders.plots import Panel, save_panels
from collabrl.engines.base import ChatMessage

ROWS = "rows.jsonl"
REJECTED = "rejected.jsonl"
STATS = "stats.json"
PLOT = "stats.png"

Key = tuple[str, int]  # (item id, sample index): one unit of work


@dataclass
class BuildFolder:
    """The folder of one build; see the module docstring for its files."""

    path: Path

    @classmethod
    @contextmanager
    def open(cls, config: Any, out: Path, resumable: frozenset[str]) -> Iterator[BuildFolder]:
        """Create the folder, or check that it holds the same experiment as `config`, for
        the block; one it made is removed if the block fails before any unit is done."""
        folder = cls(out)
        with runs.run_folder(config, out, resumable, (folder.rows_path, folder.rejected_path)):
            yield folder

    @property
    def rows_path(self) -> Path:
        return self.path / ROWS

    @property
    def rejected_path(self) -> Path:
        return self.path / REJECTED

    def rows(self) -> list[dict[str, Any]]:
        return runs.read_records(self.rows_path)

    def rejected(self) -> list[dict[str, Any]]:
        return runs.read_records(self.rejected_path)

    def done(self) -> set[Key]:
        """The units already done, as rows or as rejections."""
        return {(r["item_id"], r["sample"]) for r in [*self.rows(), *self.rejected()]}

    def reject(self, keys: list[Key], reason: str) -> set[Key]:
        """Record units as rejected for `reason` without sampling them; their keys."""
        if keys:
            with runs.RecordWriter(self.rejected_path) as rejects:
                for item_id, sample in keys:
                    rejects.write({"item_id": item_id, "sample": sample, "reason": reason})
        return set(keys)

    def export(
        self, expand: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    ) -> list[dict[str, Any]]:
        """Write rows.jsonl as a `datasets` folder too (replacing the previous export:
        a stale one must not outlive its rows); return the rows exported.

        `expand` turns one line of rows.jsonl into the training rows it holds: a unit's
        line is written whole or (torn) not at all, so a unit of several rows is one line.
        """
        import datasets

        rows = self.rows()
        if expand is not None:
            rows = [r for line in rows for r in expand(line)]
        shutil.rmtree(self.path / runs.DATASET, ignore_errors=True)
        if rows:
            # The command's own bar shows progress; datasets' bar would print under it.
            shown = datasets.is_progress_bar_enabled()
            datasets.disable_progress_bars()
            try:
                datasets.Dataset.from_list(rows).save_to_disk(str(self.path / runs.DATASET))
            finally:
                if shown:
                    datasets.enable_progress_bars()
        return rows

    def write_stats(self, stats: dict[str, Any]) -> None:
        runs.write_json(self.path / STATS, stats)

    def save_plot(self, panels: list[Panel], title: str) -> None:
        save_panels(self.path / PLOT, panels, title)


@dataclass
class BuildResult:
    """A finished (or resumed) build: its folder, its stats, the units sampled now."""

    out_dir: Path
    stats: dict[str, Any]
    new_samples: int


def sft_row(prompt: list[ChatMessage], completion: str, **columns: Any) -> dict[str, Any]:
    """One conversational prompt–completion row, bookkeeping columns after."""
    return {
        "prompt": prompt,
        "completion": [{"role": "assistant", "content": completion}],
        **columns,
    }


def reasons(rejected: list[dict[str, Any]]) -> dict[str, int]:
    """How many units were rejected for each reason, most frequent first."""
    counts: dict[str, int] = {}
    for r in rejected:
        counts[r["reason"]] = counts.get(r["reason"], 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def summary(values: list[float]) -> dict[str, float]:
    """count, min, mean, median and max of some numbers (zeros when there are none)."""
    if not values:
        return {"count": 0, "min": 0, "mean": 0, "median": 0, "max": 0}
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {
        "count": len(ordered),
        "min": ordered[0],
        "mean": round(sum(ordered) / len(ordered), 4),
        "median": median,
        "max": ordered[-1],
    }
