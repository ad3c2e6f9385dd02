"""The run folder: `config.yaml`, `samples.jsonl` (appended as samples finish) and
`metrics.json`.

Samples are appended one JSON line at a time and flushed, so a run killed with
`kill -9` keeps every finished sample; at worst the last line is cut short,
and `read_records` drops (and truncates away) that partial line on resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

from collabrl.errors import UserError

SAMPLES = "samples.jsonl"
METRICS = "metrics.json"
CONFIG = "config.yaml"


def read_records(path: Path) -> list[dict[str, Any]]:
    """All complete JSON lines of `path`; a torn final line is cut off the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):  # the writer was killed mid-line
        with path.open("r+b") as f:
            f.truncate(end)
    records = []
    # "\n" only: splitlines() would also split inside a completion holding U+2028.
    for number, line in enumerate(data[:end].decode("utf-8").split("\n"), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise UserError(
                    f"{path}:{number} is not valid JSON ({err.msg})",
                    "delete that line (its sample is regenerated) or use a new --out folder",
                ) from err
    return records


class RecordWriter:
    """Appends JSON records to a file, each flushed to the OS before returning."""

    def __init__(self, path: Path) -> None:
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (temp file + rename): readers never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
