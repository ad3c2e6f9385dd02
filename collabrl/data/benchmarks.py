"""The benchmark registry (`data/benchmarks.yaml`) and loaders for user data.

A benchmark is a list of `Item`s. Registered benchmarks ship with the package;
any JSONL / JSON / Parquet file or local Hugging Face dataset folder with a
problem and an answer column works too (column names are configurable).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

from collabrl.engines.reference import Reference
from collabrl.errors import UserError
from collabrl.rewards.verify import ANSWER_TYPES, AnswerType, is_equivalent, is_number
from collabrl.userfiles import check_regular_file, parse_json, read_user_text

if TYPE_CHECKING:
    from collabrl.config import DataColumns


# A problem row (problem, answer and solution together) longer than this is refused at
# load, or skipped by the builders (they record it as a rejection): ~25K tokens, past the
# context the models here are trained at, and a 50 MB row would only exhaust memory in
# tokenization and attention.
MAX_PROBLEM_CHARS = 100_000


@dataclass(frozen=True)
class Item:
    id: str
    problem: str
    answer: str
    # A worked solution, where the data has one: what the `reference` stand-in writes.
    solution: str | None = None
    # How answers to it are graded (rewards.verify.ANSWER_TYPES): the row's `answer_type`.
    answer_type: AnswerType = "math"

    def is_correct(self, answer: str | None) -> bool:
        """Whether `answer` is right, graded as the problem's answer type says: the one
        rule every evaluation, reward and data filter applies to this problem."""
        return is_equivalent(answer, self.answer, answer_type=self.answer_type)

    @property
    def reference(self) -> Reference:
        """What the `reference` stand-in knows of the problem (its draw is keyed by the id)."""
        return Reference(self.answer, self.solution, self.id)

    @property
    def chars(self) -> int:
        """Characters of the row's text (what MAX_PROBLEM_CHARS bounds)."""
        return len(self.problem) + len(self.answer) + len(self.solution or "")

    @property
    def oversized(self) -> bool:
        return self.chars > MAX_PROBLEM_CHARS


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    file: str
    description: str
    prompt: str = "relay"
    extract_fallback: tuple[str, ...] = ()
    split: str = "test"  # "train" marks a training set; the rest are evaluation benchmarks
    # Rows kept from the file: column -> the values kept (a subset of a file, by family).
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The registered training set whose rows are its few-shot examples (`--num-fewshot`).
    fewshot: str | None = None

    def keeps(self, row: Row) -> bool:
        return all(
            isinstance(row.data, dict) and row.data.get(column) in values
            for column, values in self.where
        )


@dataclass(frozen=True)
class Fields:
    """Column names in user-supplied data."""

    problem: str = "problem"
    answer: str = "answer"
    id: str = "id"
    solution: str = "solution"  # optional: a missing column means no solution
    answer_type: str = "answer_type"  # optional: a missing column means "math"
    split: str | None = None  # of a saved DatasetDict: required when it has several

    @classmethod
    def of(cls, columns: DataColumns) -> Fields:
        """The fields a config's `DataColumns` name."""
        return cls(
            problem=columns.problem_field,
            answer=columns.answer_field,
            id=columns.id_field,
            split=columns.split,
        )


@dataclass
class Benchmark:
    name: str
    items: list[Item]
    prompt: str = "relay"
    extract_fallback: tuple[str, ...] = field(default_factory=tuple)
    fewshot: str | None = None  # see BenchmarkSpec.fewshot


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
            split=entry.get("split", "test"),
            where=tuple(
                (column, tuple(values)) for column, values in entry.get("where", {}).items()
            ),
            fewshot=entry.get("fewshot"),
        )
        for name, entry in raw.items()
    }


def load_benchmark(
    name_or_path: str,
    fields: Fields = Fields(),
    limit: int | None = None,
    keep_oversized: bool = False,
) -> Benchmark:
    """A registered benchmark by name, or user data from a path.

    Every row is checked, not only the first `limit`: a bad row is an error that names
    its place (`file:line`), never a crash at generation time or a silently wrong score.
    A row over MAX_PROBLEM_CHARS is such an error, unless `keep_oversized` (the builders
    skip those rows themselves and count them).
    """
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be >= 1, got {limit}", "drop --limit to use every item")
    spec = registry().get(name_or_path)
    if spec is not None:
        rows = [row for row in _read_jsonl(data_dir() / spec.file) if spec.keeps(row)]
        items = _to_items(rows, Fields(), spec.file, True)
        return Benchmark(spec.name, items[:limit], spec.prompt, spec.extract_fallback, spec.fewshot)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise UserError(
            f"unknown benchmark '{name_or_path}'",
            "run `collab benchmarks` for names, or pass a .jsonl/.parquet file or dataset folder",
        )
    items = _to_items(_read_rows(path, fields.split), fields, str(path), keep_oversized)
    return Benchmark(path.stem, items[:limit], extract_fallback=("bold", "last_number"))


def fewshot_items(bench: Benchmark, count: int, seed: int) -> list[Item]:
    """`count` examples for `bench`'s prompts: rows of its training split drawn by `seed`,
    the same for every problem (so a run's examples are its own, recorded by their ids).
    A benchmark without a training split is refused: examples from its own test rows
    would show the model answers it is scored on."""
    if bench.fewshot is None:
        with_split = ", ".join(s.name for s in registry().values() if s.fewshot)
        raise UserError(
            f"benchmark '{bench.name}' has no training split to draw --num-fewshot examples from",
            f"drop --num-fewshot, or evaluate one that has: {with_split}",
        )
    pool = load_benchmark(bench.fewshot).items
    if count > len(pool):
        raise UserError(
            f"--num-fewshot {count} is more than the {len(pool)} rows of {bench.fewshot}",
            f"ask for at most {len(pool)}",
        )
    return random.Random(seed).sample(pool, count)


@dataclass(frozen=True)
class Row:
    """One record of a data file and where it is, for error messages."""

    where: str  # `file:line` in JSONL, `file row N` elsewhere
    data: Any


def _read_rows(path: Path, split: str | None = None) -> list[Row]:
    if path.is_dir():
        return _numbered(path, _read_dataset_folder(path, split))
    # A regular file only: a FIFO named data.jsonl would block the reader forever.
    check_regular_file(path, "data file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        data = _load_json(path, _read_text(path))
        if not isinstance(data, list):
            raise UserError(f"{path} must hold a JSON list of objects", "or use JSONL")
        return _numbered(path, data)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return _numbered(path, pq.read_table(path).to_pylist())
        except Exception as err:  # pyarrow raises several unrelated types
            raise UserError(f"cannot read parquet file {path}: {err}", "check the file") from err
    raise UserError(f"unsupported data file {path}", "use .jsonl, .json, .parquet or a folder")


def _numbered(path: Path, rows: list[Any]) -> list[Row]:
    return [Row(f"{path} row {number}", row) for number, row in enumerate(rows, 1)]


def _read_text(path: Path) -> str:
    return read_user_text(path, "data file")


def _read_jsonl(path: Path) -> list[Row]:
    # JSON Lines ends a record at "\n" only: str.splitlines() would also split inside a
    # string holding an unescaped U+2028 (LINE SEPARATOR), which JSON allows.
    lines = _read_text(path).split("\n")
    return [
        Row(f"{path}:{number}", _load_json(path, line, number))
        for number, line in enumerate(lines, 1)
        if line.strip()
    ]


def _load_json(path: Path, text: str, line: int | None = None) -> Any:
    return parse_json(text, f"{path}:{line}" if line else str(path))


def _read_dataset_folder(path: Path, split: str | None) -> list[dict[str, Any]]:
    import datasets

    # A FIFO or device named like an arrow file would block or never end the read.
    for file in path.rglob("*"):
        if not file.is_dir():
            check_regular_file(file, "dataset file")
    try:
        data = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise UserError(
            f"{path} is not a saved Hugging Face dataset", "save one with `Dataset.save_to_disk`"
        ) from err
    if isinstance(data, datasets.DatasetDict):
        data = data[_split_of(path, list(data), split)]
    return data.to_list()


def _split_of(path: Path, splits: list[str], split: str | None) -> str:
    """The split to read: the one named, or the only one; never a guess between several
    (a training run that took `test` by itself would train on the test set)."""
    if split is None and len(splits) == 1:
        return splits[0]
    if split is None or split not in splits:
        problem = f"{path} holds the splits {', '.join(splits)}"
        if split is not None:
            problem = f"{path} has no split '{split}': it holds {', '.join(splits)}"
        raise UserError(problem, "name one: --set split=NAME")
    return split


def _to_items(rows: list[Row], fields: Fields, where: str, keep_oversized: bool) -> list[Item]:
    """One Item per row; ids must be unique, since samples are matched to items by id."""
    if not rows:
        raise UserError(f"{where} has no rows", "check the file")
    items: list[Item] = []
    first_seen: dict[str, str] = {}
    for index, row in enumerate(rows):
        item = _to_item(row, fields, index)
        if item.id in first_seen:
            raise UserError(
                f"{row.where}: id '{item.id}' is already the id of {first_seen[item.id]}",
                "give every row its own id (two rows with one id would share their samples)",
            )
        first_seen[item.id] = row.where
        if item.oversized and not keep_oversized:
            raise UserError(
                f"{row.where}: the problem row is {item.chars:,} characters, over the "
                f"{MAX_PROBLEM_CHARS:,} a row may have",
                "shorten or drop the row (collab build-warmup and filter skip such rows)",
            )
        items.append(item)
    return items


def _to_item(row: Row, fields: Fields, index: int) -> Item:
    if not isinstance(row.data, dict):
        raise UserError(f"{row.where} is not an object", "fix the file")
    for column in (fields.problem, fields.answer):
        if column not in row.data:
            raise UserError(
                f"{row.where} has no '{column}' column (columns: {', '.join(map(str, row.data))})",
                "name the columns: --set problem_field=COLUMN "
                "--set answer_field=COLUMN [--set id_field=COLUMN]",
            )
    answer = _text(row, fields.answer, row.data[fields.answer])
    # Without an id column the 0-based row index is the id.
    return Item(
        id=_text(row, fields.id, row.data.get(fields.id, index)),
        problem=_text(row, fields.problem, row.data[fields.problem]),
        answer=answer,
        solution=_optional_text(row, fields.solution),
        answer_type=_answer_type(row, fields, answer),
    )


def _answer_type(row: Row, fields: Fields, answer: str) -> AnswerType:
    """The row's answer type, checked: a known one, and a `number` answer is a number."""
    answer_type = _optional_text(row, fields.answer_type) or "math"
    if answer_type not in ANSWER_TYPES:
        raise UserError(
            f"{row.where}: unknown {fields.answer_type} '{answer_type}'",
            f"use one of: {', '.join(ANSWER_TYPES)}",
        )
    if answer_type == "number" and not is_number(answer):
        raise UserError(
            f"{row.where}: the answer '{answer}' is not a number, but the row's "
            f"{fields.answer_type} is 'number'",
            "fix the answer, or drop the answer type to grade it as an expression",
        )
    return cast(AnswerType, answer_type)


def _optional_text(row: Row, column: str) -> str | None:
    """An optional column as text; absent or null (a gap in a Parquet column) is None."""
    value = row.data.get(column)
    return None if value is None else _text(row, column, value)


def _text(row: Row, column: str, value: Any) -> str:
    """A cell as text: a string or a number (GSM8K-style answers); anything else is an error."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        shown = "null" if value is None else type(value).__name__
        raise UserError(f"{row.where}: '{column}' is {shown}, not text", "fix the row")
    text = str(value)
    if not text.strip():
        raise UserError(f"{row.where}: '{column}' is empty", "fix the row")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        # A lone surrogate (JSON allows `\\ud800`): no tokenizer can encode it.
        raise UserError(
            f"{row.where}: '{column}' holds a lone surrogate \\u{ord(text[err.start]):04x} "
            f"at character {err.start}",
            "fix the text (a surrogate must be half of a pair)",
        ) from err
    return text
