"""Run folders (`collabrl.runs`): another command's folder is refused before anything is
written, old folders stay readable, and a run refused before its first record leaves no
folder it made."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from pathlib import Path

import pytest

from collabrl import runs
from collabrl.config import option, save_config
from collabrl.errors import UserError

RESUMABLE = frozenset({"out"})


@dataclass
class BuildConfig:
    data: str = option("arith", "Data.")
    rows: int = option(10, "Rows.")
    out: str | None = option(None, "Folder.")


@dataclass
class TrainConfig:
    model: str = option("m", "Model.")
    steps: int = option(100, "Steps.")


def records(folder: Path) -> tuple[Path, ...]:
    return (folder / "rows.jsonl",)


def test_another_commands_folder_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    save_config(TrainConfig(), tmp_path / runs.CONFIG)  # a training run, not bound yet
    before = (tmp_path / runs.CONFIG).read_text()

    with pytest.raises(UserError, match="holds another command's run") as refused:
        runs.prepare_folder(BuildConfig(), tmp_path, RESUMABLE, records(tmp_path))

    assert "BuildConfig: unknown config key 'model'" in str(refused.value)
    assert (tmp_path / runs.CONFIG).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [runs.CONFIG]


def test_a_config_that_is_not_yaml_is_one_line_and_kept(tmp_path: Path) -> None:
    (tmp_path / runs.CONFIG).write_text("key: [unclosed\n  - x\n")

    with pytest.raises(UserError, match="holds another command's run") as refused:
        runs.prepare_folder(BuildConfig(), tmp_path, RESUMABLE, records(tmp_path))

    assert "\n" not in str(refused.value)
    assert (tmp_path / runs.CONFIG).read_text() == "key: [unclosed\n  - x\n"


def test_an_old_folder_of_the_same_command_is_resumed_and_checked(tmp_path: Path) -> None:
    # Folders record nothing but their config.yaml: the same command's still binds.
    save_config(BuildConfig(rows=10), tmp_path / runs.CONFIG)
    (tmp_path / "rows.jsonl").write_text('{"id": 1}\n')

    runs.prepare_folder(BuildConfig(rows=10, out="x"), tmp_path, RESUMABLE, records(tmp_path))
    with pytest.raises(UserError, match="different rows"):
        runs.prepare_folder(BuildConfig(rows=20), tmp_path, RESUMABLE, records(tmp_path))
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_a_run_that_fails_before_any_record_leaves_no_folder_it_made(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "build-1"

    with pytest.raises(UserError), runs.run_folder(BuildConfig(), out, RESUMABLE, records(out)):
        assert (out / runs.CONFIG).is_file()
        raise UserError("the server answered garbage")

    assert list(tmp_path.iterdir()) == []  # runs/ too: this run made it


def test_a_failed_run_keeps_its_records_and_a_folder_it_did_not_make(tmp_path: Path) -> None:
    made = tmp_path / "made"
    with (
        pytest.raises(KeyboardInterrupt),
        runs.run_folder(BuildConfig(), made, RESUMABLE, records(made)),
    ):
        (made / "rows.jsonl").write_text('{"id": 1}\n')
        raise KeyboardInterrupt
    assert (made / "rows.jsonl").is_file()

    given = tmp_path / "given"
    given.mkdir()
    with pytest.raises(UserError), runs.run_folder(BuildConfig(), given, RESUMABLE, records(given)):
        raise UserError("refused")
    assert given.is_dir()


def test_a_parent_another_run_writes_in_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "a"
    with pytest.raises(UserError), runs.run_folder(BuildConfig(), out, RESUMABLE, records(out)):
        (tmp_path / "runs" / "b").mkdir()  # another run, started meanwhile
        raise UserError("refused")
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["b"]


# --- reading records never writes; a resuming writer repairs (issue 33) -------------------------

WHOLE = b'{"id": 1}\n{"id": 2}\n'


@pytest.mark.parametrize(
    ("tail", "read"),
    [
        (b'{"id": 3, "te', [1, 2]),  # torn: the writer was killed, or is mid-line now
        (b'{"id": 3}', [1, 2, 3]),  # whole, its newline not written yet
        (b'{"id": 3, "caf\xc3', [1, 2]),  # torn inside a UTF-8 character
    ],
)
def test_reading_a_file_with_an_unended_last_line_leaves_it_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tail: bytes, read: list[int]
) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_bytes(WHOLE + tail)

    assert [r["id"] for r in runs.read_records(path)] == read
    assert [r["id"] for r in runs.read_records(path)] == read
    assert path.read_bytes() == WHOLE + tail
    noted = capsys.readouterr().err.splitlines()
    assert noted == ([] if read == [1, 2, 3] else [noted[0]])  # said once, if skipped
    if noted:
        assert f"{path}:3 is cut short" in noted[0] and "skipped" in noted[0]


@pytest.mark.parametrize(
    ("tail", "kept"),
    [(b'{"id": 3, "te', b""), (b'{"id": 3}', b'{"id": 3}\n')],
)
def test_a_resuming_writer_cuts_a_torn_line_and_ends_a_whole_one(
    tmp_path: Path, tail: bytes, kept: bytes
) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_bytes(WHOLE + tail)
    with runs.RecordWriter(path) as writer:
        writer.write({"id": 4})
    assert path.read_bytes() == WHOLE + kept + b'{"id": 4}\n'


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b'{"id": \xff}', ":2 is not UTF-8 text"),
        (b"[" * 100_000, ":2 is nested too deeply"),
        (b'{"id": ' + b"7" * 5000 + b"}", ":2 holds an integer of over"),
        (b"[1, 2]", ":2 is not a JSON object"),
    ],
)
def test_a_damaged_line_before_the_last_is_one_line(
    tmp_path: Path, line: bytes, problem: str
) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_bytes(b'{"id": 1}\n' + line + b'\n{"id": 3}\n')
    with pytest.raises(UserError) as refused:
        runs.read_records(path)
    assert f"{path}{problem}" in refused.value.problem and "\n" not in str(refused.value)
    assert path.read_bytes().startswith(b'{"id": 1}\n' + line)


def _bind_repeatedly(out_dir: str, times: int, failures: multiprocessing.Queue) -> None:
    """One rank of a launch: every process binds the run folder (`started_run`)."""
    refused = 0
    for _ in range(times):
        try:
            runs.prepare_folder(BuildConfig(), Path(out_dir), RESUMABLE, ())
        except UserError:
            refused += 1
    failures.put(refused)


def test_every_rank_of_a_launch_binds_the_same_folder_at_once(tmp_path: Path) -> None:
    """Under `accelerate launch` every process writes config.yaml: through one shared temp
    file, one rank's rename took the file from under the other's ("cannot write the run
    folder", about 1 in 25 here)."""
    context = multiprocessing.get_context("spawn")
    failures = context.Queue()
    ranks = [
        context.Process(target=_bind_repeatedly, args=(str(tmp_path), 200, failures))
        for _ in range(2)
    ]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(timeout=120)
    assert [rank.exitcode for rank in ranks] == [0, 0]
    assert failures.get(timeout=5) + failures.get(timeout=5) == 0
    assert [p.name for p in tmp_path.iterdir()] == [runs.CONFIG]  # no temp file left


# -- replacing a file whole (runs.replacing, write_atomic, write_records) ----------------


def test_a_write_cut_short_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    runs.write_json(path, {"round": 1})
    with pytest.raises(RuntimeError), runs.replacing(path) as tmp:
        tmp.write_text('{"round": ')
        raise RuntimeError("killed mid-write")
    assert path.read_text() == '{\n  "round": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_each_writer_gets_its_own_temporary_file(tmp_path: Path) -> None:
    """Ranks of one launch replace the same file at once: none writes into another's."""
    path = tmp_path / "config.yaml"
    with runs.replacing(path) as first, runs.replacing(path) as second:
        assert first != second and first.parent == second.parent == tmp_path
        first.write_text("a: 1\n")
        second.write_text("a: 2\n")
    assert path.read_text() == "a: 1\n"  # the last rename (the outer one) wins, whole
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_a_link_at_the_path_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "page.html").symlink_to(victim)
    runs.write_atomic(tmp_path / "page.html", b"<p>page</p>")
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "page.html").is_symlink()
    assert (tmp_path / "page.html").read_bytes() == b"<p>page</p>"


def test_a_replaced_file_is_made_as_write_text_makes_one(tmp_path: Path) -> None:
    """Readable by whoever the umask lets read (mkstemp's 0600 would hide a run's results)."""
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    runs.write_atomic(tmp_path / "atomic.txt", "x", durable=False)
    assert (tmp_path / "atomic.txt").stat().st_mode == plain.stat().st_mode


def test_records_replace_a_json_lines_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    runs.write_records(path, [{"id": 1, "text": "é\u2028"}, {"id": 2}])
    assert runs.read_records(path) == [{"id": 1, "text": "é\u2028"}, {"id": 2}]
    runs.write_records(path, iter([{"id": 3}]))
    assert path.read_text(encoding="utf-8") == '{"id": 3}\n'
