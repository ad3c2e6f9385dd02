"""Tests for the benchmark registry and the loaders of user-supplied data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from collabrl.data.benchmarks import (
    MAX_PROBLEM_CHARS,
    Fields,
    Item,
    data_dir,
    load_benchmark,
    registry,
)
from collabrl.data.prompts import PROMPTS
from collabrl.errors import UserError

EXPECTED_COUNTS = {
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "math500": 500,
    "gsm8k": 1319,
    "minerva": 272,
    "olympiadbench": 675,
    "arith": 420,
    "arith_train": 3225,
    "arith4": 170,
    "arith4_train": 1225,
    "arith_steps": 120,
    "arith_steps_train": 360,
    "gsm8k_train": 7473,
    "math_train": 7498,
    "dapo_math_17k": 17917,
}

TRAINING_SETS = {
    "arith_train",
    "arith4_train",
    "arith_steps_train",
    "gsm8k_train",
    "math_train",
    "dapo_math_17k",
}

ROWS = [
    {"qid": "q-a", "question": "What is {x} if x = 2?", "solution": "2", "extra": 1},
    {"qid": "q-b", "question": "1 + 1 = ?", "solution": "2", "extra": 2},
    {"qid": "q-c", "question": "Name a prime.", "solution": "3", "extra": 3},
]
# Here "solution" holds the answer; the worked-solution column is named apart (absent).
CUSTOM = Fields(problem="question", answer="solution", id="qid", solution="worked")


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _expected_items(rows: list[dict]) -> list[Item]:
    return [Item(r["qid"], r["question"], r["solution"]) for r in rows]


# --- registered benchmarks -----------------------------------------------------------------------


def test_registry_lists_exactly_the_shipped_benchmarks() -> None:
    assert set(registry()) == set(EXPECTED_COUNTS)
    for spec in registry().values():
        assert (data_dir() / spec.file).is_file(), spec.file
        assert spec.prompt in PROMPTS
        assert spec.description


def test_the_training_sets_are_marked_as_such() -> None:
    assert {name for name, spec in registry().items() if spec.split == "train"} == TRAINING_SETS
    assert {spec.split for spec in registry().values()} == {"train", "test"}


@pytest.mark.parametrize(("name", "count"), sorted(EXPECTED_COUNTS.items()))
def test_registered_benchmark_loads_every_item(name: str, count: int) -> None:
    bench = load_benchmark(name)
    assert bench.name == name
    assert len(bench.items) == count
    assert len({item.id for item in bench.items}) == count
    assert all(item.problem.strip() and item.answer.strip() for item in bench.items)
    assert bench.prompt == registry()[name].prompt


@pytest.mark.parametrize("file", sorted(p.name for p in data_dir().glob("*.jsonl")))
def test_every_shipped_data_file_loads(file: str) -> None:
    """Training files too: gsm8k_train.jsonl holds a U+2028 inside row gsm8k-train-2381."""
    path = data_dir() / file
    rows = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    items = load_benchmark(str(path)).items
    assert len(items) == len(rows)
    assert [item.id for item in items] == [json.loads(row)["id"] for row in rows]


@pytest.mark.parametrize(
    ("subset", "whole"), [("arith4", "arith"), ("arith4_train", "arith_train")]
)
def test_a_where_entry_keeps_its_families_in_file_order(subset: str, whole: str) -> None:
    families = ("add1", "add2", "sub2", "mul21")
    kept = [i for i in load_benchmark(whole).items if i.id.split("-")[2] in families]
    assert load_benchmark(subset).items == kept
    assert [i.id.split("-")[2] for i in kept[:8]] == [*families, *families]  # --limit 8: 2 each


def test_gsm8k_falls_back_to_a_bold_answer_then_the_last_number() -> None:
    assert load_benchmark("gsm8k", limit=1).extract_fallback == ("bold", "last_number")
    assert load_benchmark("aime24", limit=1).extract_fallback == ()


def test_limit_takes_the_first_items_in_order() -> None:
    full = load_benchmark("amc23")
    assert load_benchmark("amc23", limit=5).items == full.items[:5]
    assert load_benchmark("amc23", limit=1000).items == full.items


@pytest.mark.parametrize("limit", [0, -3])
def test_non_positive_limit_is_a_user_error(limit: int) -> None:
    with pytest.raises(UserError, match="--limit must be >= 1"):
        load_benchmark("aime24", limit=limit)


def test_registered_names_ignore_custom_fields() -> None:
    # The shipped files always use id/problem/answer, whatever the user's columns are.
    custom = load_benchmark("aime24", CUSTOM, limit=2)
    assert custom.items == load_benchmark("aime24", limit=2).items


@pytest.mark.parametrize(
    ("name", "has_solutions"),
    [
        ("gsm8k", True),
        ("gsm8k_train", True),
        ("math500", True),
        ("minerva", True),
        ("arith", False),
    ],
)
def test_solutions_are_read_where_the_data_has_them(name: str, has_solutions: bool) -> None:
    [item] = load_benchmark(name, limit=1).items
    assert (item.solution is not None) == has_solutions
    if name == "gsm8k":
        assert item.solution.endswith("#### 18") and item.answer == "18"


def test_unknown_name_is_a_user_error() -> None:
    with pytest.raises(UserError) as info:
        load_benchmark("gsm9k")
    assert "unknown benchmark 'gsm9k'" in info.value.problem
    assert "collab benchmarks" in info.value.fix


# --- user data -----------------------------------------------------------------------------------


def test_jsonl_with_custom_field_names(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "mine.jsonl", ROWS)
    bench = load_benchmark(str(path), CUSTOM)
    assert bench.name == "mine"
    assert bench.items == _expected_items(ROWS)
    assert bench.prompt == "relay"
    assert bench.extract_fallback == ("bold", "last_number")


def test_jsonl_limit_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "gaps.jsonl"
    path.write_text("\n" + json.dumps(ROWS[0]) + "\n\n   \n" + json.dumps(ROWS[1]) + "\n")
    assert len(load_benchmark(str(path), CUSTOM).items) == 2
    assert load_benchmark(str(path), CUSTOM, limit=1).items == _expected_items(ROWS[:1])


def test_solution_column_is_optional_and_must_be_text(tmp_path: Path) -> None:
    rows = [
        {"problem": "p", "answer": 1, "solution": "since 1"},
        {"problem": "q", "answer": 2, "solution": None},
        {"problem": "r", "answer": 3},
    ]
    items = load_benchmark(str(_write_jsonl(tmp_path / "sol.jsonl", rows))).items
    assert [i.solution for i in items] == ["since 1", None, None]
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "p", "answer": 1, "solution": [1]}])
    with pytest.raises(UserError, match="'solution' is list, not text"):
        load_benchmark(str(bad))


def test_the_answer_type_column_sets_how_each_row_is_graded(tmp_path: Path) -> None:
    rows = [
        {"problem": "What is 36 × 15?", "answer": "540", "answer_type": "number"},
        {"problem": "Simplify 36 × 15.", "answer": "540"},
    ]
    number, math = load_benchmark(str(_write_jsonl(tmp_path / "t.jsonl", rows))).items
    assert (number.answer_type, math.answer_type) == ("number", "math")
    assert not number.is_correct("36 \\times 15") and math.is_correct("36 \\times 15")
    assert number.is_correct("540") and number.is_correct("36 \\times 15 = 540")


@pytest.mark.parametrize("name", ["arith", "arith_train", "arith_steps", "arith_steps_train"])
def test_arith_answers_are_graded_as_numbers(name: str) -> None:
    items = load_benchmark(name).items
    assert {item.answer_type for item in items} == {"number"}
    assert all(item.is_correct(item.answer) for item in items[:50])


def test_row_number_is_the_id_without_an_id_column(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "noid.jsonl", [{"problem": "p", "answer": 1}] * 3)
    items = load_benchmark(str(path)).items
    assert [i.id for i in items] == ["0", "1", "2"]
    assert items[0].answer == "1"  # non-string answers become strings


def test_json_list_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(ROWS))
    assert load_benchmark(str(path), CUSTOM).items == _expected_items(ROWS)


def test_json_file_that_is_not_a_list_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "obj.json"
    path.write_text(json.dumps({"rows": ROWS}))
    with pytest.raises(UserError, match="JSON list"):
        load_benchmark(str(path), CUSTOM)


def test_parquet_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "mine.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    bench = load_benchmark(str(path), CUSTOM, limit=2)
    assert bench.name == "mine"
    assert bench.items == _expected_items(ROWS[:2])


def test_broken_parquet_file_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(UserError, match="cannot read parquet"):
        load_benchmark(str(path))


def test_saved_hf_dataset_folder(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(folder))
    bench = load_benchmark(str(folder), CUSTOM)
    assert bench.name == "ds"
    assert bench.items == _expected_items(ROWS)


def test_a_saved_dataset_dict_is_read_at_the_split_named_never_a_guessed_one(
    tmp_path: Path,
) -> None:
    import dataclasses

    import datasets

    folder = tmp_path / "dsd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(ROWS[:1]),
            "test": datasets.Dataset.from_list(ROWS[1:]),
        }
    ).save_to_disk(str(folder))
    test = load_benchmark(str(folder), dataclasses.replace(CUSTOM, split="test"))
    assert test.items == _expected_items(ROWS[1:])
    train = load_benchmark(str(folder), dataclasses.replace(CUSTOM, split="train"))
    assert train.items == _expected_items(ROWS[:1])
    with pytest.raises(UserError, match="holds the splits train, test; name one"):
        load_benchmark(str(folder), CUSTOM)
    with pytest.raises(UserError, match="has no split 'dev'"):
        load_benchmark(str(folder), dataclasses.replace(CUSTOM, split="dev"))


def test_a_dataset_dict_of_one_split_needs_no_name(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "one"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(folder))
    assert load_benchmark(str(folder), CUSTOM).items == _expected_items(ROWS)


def test_a_fifo_in_a_saved_dataset_folder_is_refused_not_read(tmp_path: Path) -> None:
    """A FIFO named like the arrow file would block `load_from_disk` forever."""
    import datasets

    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(folder))
    arrow = next(folder.rglob("*.arrow"))
    arrow.unlink()
    os.mkfifo(arrow)
    with pytest.raises(UserError, match="not a regular file"):
        load_benchmark(str(folder), CUSTOM)


def test_folder_that_is_not_a_dataset_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(UserError, match="not a saved Hugging Face dataset"):
        load_benchmark(str(tmp_path))


def test_missing_column_names_the_columns(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "mine.jsonl", ROWS)
    with pytest.raises(UserError) as info:
        load_benchmark(str(path))  # default field names: problem / answer
    problem = info.value.problem
    assert "no 'problem' column" in problem
    for column in ("qid", "question", "solution", "extra"):
        assert column in problem
    # The hint names options that exist (there is no --problem-field).
    assert "--set problem_field=" in info.value.fix and "--set answer_field=" in info.value.fix


def test_missing_answer_column(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "mine.jsonl", ROWS)
    with pytest.raises(UserError, match="no 'answer' column"):
        load_benchmark(str(path), Fields(problem="question"))


def test_column_missing_in_a_later_row_is_a_user_error(tmp_path: Path) -> None:
    rows = [*ROWS[:2], {"qid": "q-z", "prompt": "renamed", "solution": "1"}]
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(UserError, match=r"mixed\.jsonl:3 has no 'question' column"):
        load_benchmark(str(path), CUSTOM)


def test_bad_json_line_names_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n{oops\n")
    with pytest.raises(UserError) as info:
        load_benchmark(str(path), CUSTOM)
    assert f"{path}:3" in info.value.problem
    assert "not valid JSON" in info.value.problem


def test_empty_file_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(UserError, match="has no rows"):
        load_benchmark(str(path))


def test_unsupported_suffix_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("problem,answer\n1+1,2\n")
    with pytest.raises(UserError, match="unsupported data file"):
        load_benchmark(str(path))


def test_non_utf8_jsonl_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        b'{"problem": "1", "answer": "1"}\n' + '{"problem": "caf\u00e9"}\n'.encode("latin-1")
    )
    with pytest.raises(UserError, match=r"latin1\.jsonl:2 is not UTF-8 text"):
        load_benchmark(str(path))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"problem": ' + "[" * 100_000, ":2 is nested too deeply to read"),
        (
            '{"problem": "1", "answer": ' + "9" * 5000 + "}",
            ":2 holds an integer of over 4300 digits",
        ),
    ],
)
def test_a_row_python_cannot_read_is_one_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "hostile.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + text + "\n")
    with pytest.raises(UserError) as info:
        load_benchmark(str(path), CUSTOM)
    assert f"{path}{problem}" in info.value.problem


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_a_fifo_as_data_is_refused_without_opening_it(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"data{suffix}"
    os.mkfifo(path)  # opening it to read would wait for a writer forever
    with pytest.raises(UserError, match="not a regular file"):
        load_benchmark(str(path))


def test_line_separators_inside_strings_do_not_split_rows(tmp_path: Path) -> None:
    problem = "First\u2028second\u2029third\x85fourth\x0cfifth"
    path = tmp_path / "seps.jsonl"
    path.write_text(json.dumps({"problem": problem, "answer": "1"}, ensure_ascii=False) + "\n")
    assert load_benchmark(str(path)).items == [Item("0", problem, "1")]


# --- bad rows: one error naming file:line --------------------------------------------------------


def _bad_jsonl(tmp_path: Path, bad_row: dict | str) -> Path:
    """A file whose third line (after a blank one) is `bad_row`."""
    line = bad_row if isinstance(bad_row, str) else json.dumps(bad_row)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "a", "problem": "p", "answer": "1"}) + "\n\n" + line + "\n")
    return path


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "b", "problem": None, "answer": "1"}, "'problem' is null, not text"),
        ({"id": "b", "problem": "p", "answer": None}, "'answer' is null, not text"),
        ({"id": "b", "problem": ["p"], "answer": "1"}, "'problem' is list, not text"),
        ({"id": "b", "problem": "p", "answer": True}, "'answer' is bool, not text"),
        ({"id": "b", "problem": "  ", "answer": "1"}, "'problem' is empty"),
        ({"id": None, "problem": "p", "answer": "1"}, "'id' is null, not text"),
        ('{"id": "b", "problem": "x\\ud800y", "answer": "1"}', "lone surrogate \\ud800"),
        ('{"id": "b", "problem": "p", "answer": "\\udfff"}', "lone surrogate \\udfff"),
        ({"id": "a", "problem": "q", "answer": "2"}, "id 'a' is already the id of"),
        ('["p", "1"]', "is not an object"),
        ({"id": "b", "problem": "p", "answer": "1", "answer_type": "int"}, "answer_type 'int'"),
        (
            {"id": "b", "problem": "p", "answer": "x + 1", "answer_type": "number"},
            "the answer 'x + 1' is not a number",
        ),
    ],
)
def test_bad_row_is_one_error_naming_its_line(tmp_path: Path, row, message: str) -> None:
    path = _bad_jsonl(tmp_path, row)
    with pytest.raises(UserError) as info:
        load_benchmark(str(path))
    assert info.value.problem.startswith(f"{path}:3"), info.value.problem
    assert message in info.value.problem
    str(info.value).encode("utf-8")  # printable: the surrogate itself is not in the message


def test_duplicate_id_names_both_rows(tmp_path: Path) -> None:
    path = _bad_jsonl(tmp_path, {"id": "a", "problem": "q", "answer": "2"})
    with pytest.raises(UserError, match=rf"{path}:3: id 'a' is already the id of {path}:1"):
        load_benchmark(str(path), limit=1)  # found even beyond --limit


def test_numeric_ids_that_collide_as_text_are_duplicates(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "ids.jsonl",
        [{"id": 1, "problem": "p", "answer": "1"}, {"id": "1", "problem": "q", "answer": "2"}],
    )
    with pytest.raises(UserError, match="id '1' is already"):
        load_benchmark(str(path))


def test_bad_row_in_parquet_names_its_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "nulls.parquet"
    rows = [{"problem": "p", "answer": "1"}, {"problem": None, "answer": "2"}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(UserError, match=rf"{path} row 2: 'problem' is null"):
        load_benchmark(str(path))


def test_an_oversized_row_is_refused_at_load_unless_a_builder_keeps_it(tmp_path: Path) -> None:
    huge = "1 + " * (MAX_PROBLEM_CHARS // 4) + "1"
    rows = [{"problem": "What is 1 + 1?", "answer": "2"}, {"problem": huge, "answer": "x"}]
    path = _write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(UserError, match=rf"{path}:2: the problem row is 100,00\d characters"):
        load_benchmark(str(path), limit=1)  # found even beyond --limit
    kept = load_benchmark(str(path), keep_oversized=True).items
    assert [item.oversized for item in kept] == [False, True]
