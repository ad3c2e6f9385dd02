"""Run folders, on the base floor: `config.yaml`, `samples.jsonl` (appended as samples
finish) and `metrics.json`. Evaluation, builders, evolve and training all write their
folders through here (builders' folders, `collabrl.builders.folder`, open the same way),
so none of them imports another for it.

`config.yaml` holds what the run reads: its caller leaves out the sections the run never
reads (another protocol's section, another method's fields), which load as their
defaults. A header of YAML comments says how it ran (`provenance`): the command line, the
date, the versions and the git commit; the file stays a `--config` file.

Samples are appended one JSON line at a time and flushed, so a run killed with
`kill -9` keeps every finished sample; at worst the last line is cut short:
`read_records` skips it, and the resumed run's `RecordWriter` cuts it off before appending.
A whole file is replaced through `replacing` (a temporary file beside it, synced, then
renamed over it): the one such helper, which every layer above this one uses.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

from collabrl.config import build_config, read_yaml, save_config, to_dict
from collabrl.episode import Episode
from collabrl.errors import UserError
from collabrl.redact import redact_command, redact_text
from collabrl.userfiles import parse_json, read_user_bytes

SAMPLES = "samples.jsonl"
METRICS = "metrics.json"
CONFIG = "config.yaml"
# A builder folder's rows saved as a `datasets` folder: builders write it, `train sft` reads it.
DATASET = "dataset"


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON records of `path`, one a line, read without ever writing to it: a live
    run may be appending (`collab train rollouts`, `collab eval report` on a running
    job). A torn last line (its writer killed, or still writing it) is skipped with a
    note; a valid last line without its newline is a complete record. Only a resuming
    writer repairs the file (`RecordWriter`)."""
    if not path.exists():
        return []
    lines = read_user_bytes(path, "run file").split(b"\n")
    records = []
    # b"\n" only: splitlines() would also split inside a completion holding U+2028.
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(_parse_record(line, path, number))
        except UserError:
            if number < len(lines):  # a line that ends: damaged, not torn
                raise
            _note_torn(path, number)
    return records


def _parse_record(line: bytes, path: Path, number: int) -> dict[str, Any]:
    where = f"{path}:{number}"
    fix = "delete that line (its sample is regenerated) or use a new --out folder"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{where} is not UTF-8 text", fix) from err
    record = parse_json(text, where, fix)
    if not isinstance(record, dict):
        raise UserError(f"{where} is not a JSON object", fix)
    return record


# Torn lines already noted by this process: a command reads a file several times.
_noted: set[tuple[Path, int]] = set()


def _note_torn(path: Path, number: int) -> None:
    if (path, number) not in _noted:
        _noted.add((path, number))
        print(
            f"note: {path}:{number} is cut short (a run still writing it, or killed "
            "mid-line); skipped, and a resumed run writes that record again",
            file=sys.stderr,
        )


def _repair_tail(path: Path) -> None:
    """Before appending: end a valid last line that lacks its newline, and cut a torn one
    off (its unit of work is redone), so the next record starts a line of its own."""
    if not path.exists():
        return
    data = path.read_bytes()
    start = data.rfind(b"\n") + 1
    if start == len(data):
        return
    try:
        _parse_record(data[start:], path, data.count(b"\n") + 1)
    except UserError:
        with path.open("r+b") as f:
            f.truncate(start)
    else:
        with path.open("ab") as f:
            f.write(b"\n")


def samples_by_item(out_dir: Path, n: int) -> dict[str, list[dict[str, Any]]]:
    """The samples.jsonl of a run folder by problem id: each problem's first `n` samples,
    in sample order (what its metrics are computed over)."""
    return group_by_item(read_records(out_dir / SAMPLES), n)


def group_by_item(records: list[dict[str, Any]], n: int) -> dict[str, list[dict[str, Any]]]:
    """Sample records by problem id: each problem's first `n`, in sample order."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        grouped.setdefault(record["item_id"], []).append(record)
    return {item: sorted(found, key=lambda r: r["sample"])[:n] for item, found in grouped.items()}


def episode_in(record: dict[str, Any], where: str) -> Episode:
    """The Episode a rollouts.jsonl or samples.jsonl record keeps, each field the readers
    show (`collab view`, the HTML page) of the type they show it as; else a one-line
    refusal naming the record (`where`): a hand-edited or foreign file must not reach
    them and end in a traceback."""
    try:
        data = record["episode"]
        if not isinstance(data, dict):
            raise TypeError(f"the episode is a {type(data).__name__}, not a mapping")
        episode = Episode.from_dict(data)
        _check_shown_types(episode)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UserError(
            f"{where} holds no readable episode ({err!r:.80})",
            "pass a run folder written by collabrl, or delete that record",
        ) from err
    return episode


def _check_shown_types(episode: Episode) -> None:
    """TypeError unless what is shown of `episode` has its type: `Episode.from_dict`
    builds whatever the file holds."""
    strategies = episode.meta.get("strategies")
    if strategies is not None and not (
        isinstance(strategies, list) and all(isinstance(s, str) for s in strategies)
    ):
        raise TypeError("meta.strategies is not a list of names")
    for segment in episode.segments:
        if not (
            isinstance(segment.text, str)
            and isinstance(segment.token_ids, list)
            and isinstance(segment.meta, dict)
        ):
            raise TypeError(f"a {segment.author} segment's text, token_ids or meta is malformed")
        requested = segment.meta.get("requested_tokens")
        if requested is not None and type(requested) is not int:
            raise TypeError(f"a {segment.author} segment's requested_tokens is not a count")


class RecordWriter:
    """Appends JSON records to a file, each flushed to the OS before returning; a file
    left with a torn or unended last line (a killed run) is repaired first."""

    def __init__(self, path: Path) -> None:
        _repair_tail(path)
        self._file: TextIO = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def replacing(path: Path, durable: bool = True) -> Iterator[Path]:
    """A temporary path beside `path` for the body to write a file at; when the body ends
    without an error that file is synced to disk (unless not `durable`) and renamed over
    `path`, else removed. The one way collabrl replaces a file: a reader, or a run killed
    at any point, sees the old file or the new one, never half of either.

    The temporary name is random, so concurrent writers (every rank of a launch) never
    share one and no one can plant a link there in advance; the rename replaces a link
    at `path` rather than writing through it.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        yield tmp
        if durable:
            # Synced before the rename: otherwise a power cut may leave the new name
            # pointing at blocks never written.
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: str | bytes, durable: bool = True) -> None:
    """Replace `path` with `data` (text as UTF-8) through `replacing`."""
    with replacing(path, durable) as tmp:
        # Created exclusively (O_EXCL): never written through a link. Made and written in
        # one open: truncating a file that exists makes ext4 flush it on close
        # (auto_da_alloc), a millisecond a write (bench/library_swaps.py).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` with `data` as indented JSON (`write_atomic`)."""
    write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace the JSON-lines file `path` whole (`write_atomic`), one record a line as
    `RecordWriter` appends them: a file rewritten from others (a filter's rows, a
    rewound metrics log) keeps its previous version if the rewrite is killed."""
    write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def prepare_folder(
    config: Any,
    out_dir: Path,
    resumable: frozenset[str],
    bound_by: tuple[Path, ...],
    omit: frozenset[str] = frozenset(),
) -> None:
    """Create `out_dir` and save `config` in it, or refuse to mix two experiments there.

    A folder whose config.yaml is another command's (an eval run given to train, a train
    run given to evolve) is refused before anything is written: saving over it would
    lose that run's config. Only finished work (records in a `bound_by` file) binds a
    folder to its experiment: a run that failed before doing any (say, a mistyped
    --model) must not block the corrected one. Keys in `resumable` (resources,
    bookkeeping) may change between runs. The dotted keys in `omit` (sections the run
    never reads) are neither saved nor compared: a folder saved whole before they were
    left out resumes all the same.
    """
    saved = out_dir / CONFIG
    try:
        if saved.exists():
            previous = to_dict(saved_config(type(config), out_dir), omit)
            if any(read_records(path) for path in bound_by):
                _check_same_experiment(to_dict(config, omit), previous, out_dir, resumable)
        out_dir.mkdir(parents=True, exist_ok=True)
        # A run killed here leaves the old config, not half of it; every rank of a launch
        # binds the folder, each through its own temporary file.
        with replacing(saved) as tmp:
            save_config(config, tmp, omit, provenance())  # proves the folder is writable, too
    except OSError as err:
        raise UserError(
            f"cannot write the run folder {out_dir}: {err.strerror or err}",
            "pass --out a folder path you can write (not a file, nor a path under a file)",
        ) from err


# The packages whose installed versions config.yaml's header records.
RECORDED_PACKAGES = ("collabrl", "torch", "transformers", "trl")
# Seconds a git call may take: a slow or hung git costs the header its commit, never the run.
GIT_TIMEOUT_S = 5.0


# How config.yaml's header starts: a reader tells a run folder collabrl wrote from a
# user's own config.yaml by it (eval/cautions.py).
WRITTEN_BY = "written by collabrl"


def provenance() -> str:
    """config.yaml's header, YAML comments: the command line as this process was started
    (under `accelerate launch`, its own), its secrets redacted, the date in UTC, the
    installed versions (read from the package metadata: nothing is imported) and the git
    commit of the working directory's repository, if any."""
    lines = [
        f"{WRITTEN_BY}: keys left out are defaults this run never reads",
        # Redacted: the header is for people, and a run folder gets shared (`--api-key X`).
        f"command: {shlex.join(redact_command(sys.argv))}",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        "versions: " + ", ".join(f"{name} {v}" for name, v in installed_versions().items()),
    ]
    commit = git_commit()
    if commit is not None:
        lines.append(f"git commit: {commit}")
    return "".join(f"# {one_line(line)}\n" for line in lines)


def installed_versions(packages: tuple[str, ...] | None = None) -> dict[str, str]:
    """Each package's installed version (default: RECORDED_PACKAGES, read at the call),
    from its metadata (nothing is imported); "not installed" for one that is not."""
    return {name: _installed(name) for name in packages or RECORDED_PACKAGES}


def _installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def one_line(text: str) -> str:
    """`text` on one line YAML accepts: a newline or other control character in an
    argument (a `--set` value) would end the comment, or be refused by the YAML reader,
    so each is written as its escape (`\\n`)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def git_commit(folder: Path | None = None) -> str | None:
    """The commit checked out in the git repository of `folder` (default: the working
    directory), with "+dirty" when tracked files have uncommitted changes; None without
    one (no git, not a repository, no commit yet, git slower than GIT_TIMEOUT_S, or a
    filter driver whose name `-c` cannot carry, so that it could not be switched off)."""
    try:
        head = _git("rev-parse", "--verify", "HEAD", cwd=folder)
        filters = _filters_off(folder)
        if filters is None:
            return None
        # --no-optional-locks: a status refresh must not take the index lock from the user.
        # --ignore-submodules: a submodule's status is another git, reading its own config.
        changes = _git(
            *filters,
            "--no-optional-locks",
            "status",
            "--porcelain",
            "-uno",
            "--ignore-submodules=all",
            cwd=folder,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    # Bytes: a path in the status need not be UTF-8; the commit is hex.
    return head.decode("ascii", "replace").strip() + ("+dirty" if changes.strip() else "")


# On every git call. A repository's own config (.git/config of a cloned or unpacked
# folder, which its author wrote) can name programs git runs as it reads the working
# tree: an fsmonitor hook on each status, hooks (post-index-change); recording a commit
# must run none of them.
GIT_SAFE = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")


def _filters_off(folder: Path | None = None) -> list[str] | None:
    """`-c` options that switch off every filter driver git's config defines: status
    runs a file's clean filter (or long-running `process`) to compare a tracked file
    whose stat data changed, and `.gitattributes` picks the driver. Emptied, a driver runs
    nothing (a file it would have cleaned may then read as changed: "+dirty" errs on the
    side of saying so). None when a driver's name holds `=`, which `-c` cannot carry."""
    listed = _git(
        "config", "-z", "--name-only", "--get-regexp", r"^filter\.", ok=(0, 1), cwd=folder
    )
    # Keys are `filter.<name>.<variable>`; the name may hold dots.
    keys = listed.split(b"\0")
    names = {os.fsdecode(key[len(b"filter.") :].rpartition(b".")[0]) for key in keys}
    names.discard("")
    if any("=" in name for name in names):
        return None
    options = []
    for name in sorted(names):
        for setting in ("clean=", "process=", "required=false"):
            options += ["-c", f"filter.{name}.{setting}"]
    return options


def _git(*args: str, ok: tuple[int, ...] = (0,), cwd: Path | None = None) -> bytes:
    # In the working directory as git finds it (a deleted one fails git, not the run).
    done = subprocess.run(
        ["git", *GIT_SAFE, *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
    )
    if done.returncode not in ok:
        raise subprocess.CalledProcessError(done.returncode, done.args)
    return done.stdout


def saved_config(cls: type, out_dir: Path) -> Any:
    """The config saved in `out_dir`, read as a `cls`: every command's config class has
    its own keys, so another command's config.yaml does not read as this one's (old
    folders, which record nothing else, stay readable)."""
    try:
        return build_config(cls, [read_yaml(out_dir / CONFIG)])
    except UserError as err:
        reason = err.problem.splitlines()[0]  # a YAML error spans lines
        raise UserError(
            f"{out_dir} holds another command's run: its {CONFIG} is not this command's "
            f"({cls.__name__}: {reason})",
            "use a new --out folder for this command",
        ) from err


def _check_same_experiment(
    current: dict[str, Any], previous: dict[str, Any], out_dir: Path, resumable: frozenset[str]
) -> None:
    changed = [k for k in current if k not in resumable and current[k] != previous.get(k)]
    if changed:
        key, there, now = _difference(changed[0], previous.get(changed[0]), current[changed[0]])
        raise UserError(
            f"{out_dir} holds a run with a different {key} ({there!r} there, {now!r} now)",
            "use a new --out folder, or repeat the original options to resume it",
        )


def _difference(key: str, there: Any, now: Any) -> tuple[str, Any, Any]:
    """The dotted key, under `key`, of the first value that differs between two sections,
    with both values: the error names `protocol.relay.max_calls`, not a whole section."""
    if isinstance(there, dict) and isinstance(now, dict):
        for sub, value in now.items():
            if value != there.get(sub):
                return _difference(f"{key}.{sub}", there.get(sub), value)
    return key, there, now


@contextmanager
def run_folder(
    config: Any,
    out_dir: Path,
    resumable: frozenset[str],
    bound_by: tuple[Path, ...],
    remove: bool = True,
    omit: frozenset[str] = frozenset(),
) -> Iterator[None]:
    """`prepare_folder`, and the folders it made removed again when the block fails
    before any work is recorded in `bound_by`: a refused run leaves no run folder.
    `remove=False` for every process of a multi-process run but the main one, which
    alone removes what they share."""
    made = _missing_folders(out_dir) if remove else []
    try:
        prepare_folder(config, out_dir, resumable, bound_by, omit)
        yield
    except BaseException:
        if made and not _holds_work(bound_by):
            _remove_made(made)
        raise


def _holds_work(bound_by: tuple[Path, ...]) -> bool:
    """Whether a run recorded finished work; an unreadable record counts as work, so a
    folder holding one is never removed."""
    try:
        return any(read_records(path) for path in bound_by)
    except UserError:
        return True


def _missing_folders(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _remove_made(made: list[Path]) -> None:
    """Remove the run folder this run made, then the parents it made while they are
    empty (another run may have started in one meanwhile)."""
    shutil.rmtree(made[0], ignore_errors=True)
    for parent in made[1:]:
        try:
            parent.rmdir()
        except OSError:
            return


def out_folder(out: str | None, kind: str, data: str, model: str) -> Path:
    """`out`, or a new folder under runs/ named after the job, data, model and time."""
    if out:
        return Path(out)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    # Redacted: a URL without a path (`http://user:pw@host`) would name the folder.
    model_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(redact_text(model).rstrip("/")).name)[:40]
    data_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(data).stem)
    return Path("runs") / f"{kind}-{data_name}-{model_name}-{stamp}"
