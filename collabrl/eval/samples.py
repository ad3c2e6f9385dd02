"""A finished eval run's samples.jsonl, read back and checked record by record: what the
report and the router baselines read of `collab eval`'s output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.errors import UserError

NOT_A_RUN = "pass the run folders of `collab eval`"


def short(value: Any, limit: int = 40) -> str:
    """A bounded repr for an error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# What the report reads of a sample, and its type: samples.jsonl as `collab eval` writes it.
SAMPLE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "item_id": str,
    "sample": int,
    "correct": bool,
    "calls": int,
    "helper_tokens": int,
    "completion_tokens": int,
}
REQUIRED_SAMPLE_FIELDS = ("item_id", "sample", "correct")


def read_samples(run_dir: Path, needs: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The records of a run's samples.jsonl, refused in one line unless each is a sample as
    `collab eval` writes it (the fields in SAMPLE_FIELDS, of their types; the required
    ones and those the caller `needs` present)."""
    path = run_dir / runs.SAMPLES
    records = runs.read_records(path)  # refuses lines that are not JSON objects
    for number, record in enumerate(records, 1):
        problem = _sample_problem(record, (*REQUIRED_SAMPLE_FIELDS, *needs))
        if problem is not None:
            raise UserError(f"{path}: record {number} {problem}", NOT_A_RUN)
    return records


def _sample_problem(record: dict[str, Any], required: tuple[str, ...]) -> str | None:
    """What makes `record` no sample of `collab eval`, or None."""
    for key, kind in SAMPLE_FIELDS.items():
        if key not in record:
            if key in required:
                return f"has no {key}"
            continue
        value = record[key]
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            return f"has {key} {short(value)}, of the wrong type"
    return None
