"""The benchmark registry (`data/benchmarks.yaml`) and loaders for user data.

A benchmark is a list of `Item`s. Registered benchmarks ship with the package;
any JSONL / JSON / Parquet file or local Hugging Face dataset folder with a
problem and an answer column works too (column names are configurable).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from collabrl.errors import UserError


@dataclass(frozen=True)
class Item:
    id: str
    problem: str
    answer: str


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    file: str
    description: str
    prompt: str = "relay"
    extract_fallback: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fields:
    """Column names in user-supplied data."""

    problem: str = "problem"
    answer: str = "answer"
    id: str = "id"


@dataclass
class Benchmark:
    name: str
    items: list[Item]
    prompt: str = "relay"
    extract_fallback: tuple[str, ...] = field(default_factory=tuple)


def data_dir() -> Path:
    """Folder holding the shipped data files.

    In a wheel they live in `collabrl/_data`; in a source checkout (editable
    install) they are the repository's top-level `data/`.
    """
    packaged = Path(__file__).resolve().parent.parent / "_data"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "data"


@cache
def registry() -> dict[str, BenchmarkSpec]:
    raw = yaml.safe_load((data_dir() / "benchmarks.yaml").read_text())
    return {
        name: BenchmarkSpec(
            name=name,
            file=entry["file"],
            description=entry["description"],
            prompt=entry.get("prompt", "relay"),
            extract_fallback=tuple(entry.get("extract_fallback", ())),
        )
        for name, entry in raw.items()
    }


def load_benchmark(
    name_or_path: str, fields: Fields = Fields(), limit: int | None = None
) -> Benchmark:
    """A registered benchmark by name, or user data from a path."""
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be >= 1, got {limit}", "drop --limit to use every item")
    spec = registry().get(name_or_path)
    if spec is not None:
        rows = _read_jsonl(data_dir() / spec.file)
        items = _to_items(rows, Fields(), spec.file)
        return Benchmark(spec.name, items[:limit], spec.prompt, spec.extract_fallback)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise UserError(
            f"unknown benchmark '{name_or_path}'",
            "run `collab benchmarks` for names, or pass a .jsonl/.parquet file or dataset folder",
        )
    items = _to_items(_read_rows(path), fields, str(path))
    return Benchmark(path.stem, items[:limit], extract_fallback=("last_number",))


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.is_dir():
        return _read_dataset_folder(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        data = _load_json(path, path.read_text())
        if not isinstance(data, list):
            raise UserError(f"{path} must hold a JSON list of objects", "or use JSONL")
        return data
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises several unrelated types
            raise UserError(f"cannot read parquet file {path}: {err}", "check the file") from err
    raise UserError(f"unsupported data file {path}", "use .jsonl, .json, .parquet or a folder")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path}: {err}", "check the path and encoding") from err
    return [_load_json(path, line, n) for n, line in enumerate(lines, 1) if line.strip()]


def _load_json(path: Path, text: str, line: int | None = None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        where = f"{path}:{line}" if line else str(path)
        raise UserError(f"{where} is not valid JSON ({err.msg})", "fix the file") from err


def _read_dataset_folder(path: Path) -> list[dict[str, Any]]:
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise UserError(
            f"{path} is not a saved Hugging Face dataset", "save one with `Dataset.save_to_disk`"
        ) from err
    if isinstance(data, datasets.DatasetDict):
        split = "test" if "test" in data else next(iter(data))
        data = data[split]
    return data.to_list()


def _to_items(rows: list[dict[str, Any]], fields: Fields, where: str) -> list[Item]:
    if not rows:
        raise UserError(f"{where} has no rows", "check the file")
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise UserError(f"{where}: row {number} is not an object", "fix the file")
        for column in (fields.problem, fields.answer):
            if column not in row:
                raise UserError(
                    f"{where} has no '{column}' column"
                    + (f" in row {number}" if number > 1 else "")
                    + f" (columns: {', '.join(map(str, row))})",
                    "name the columns with --problem-field / --answer-field",
                )
    return [
        Item(
            id=str(row.get(fields.id, index)),
            problem=str(row[fields.problem]),
            answer=str(row[fields.answer]),
        )
        for index, row in enumerate(rows)
    ]
