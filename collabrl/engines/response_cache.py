"""The expert pool's response cache: successful deterministic answers on disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.engines.base import Prompt, SamplingParams

log = logging.getLogger(__name__)


def cacheable(params: SamplingParams) -> bool:
    """Only a deterministic request may be answered from the cache.

    An unseeded sample is meant to differ every time; replaying one would silently
    collapse an expert's diversity into its first answer.
    """
    return params.greedy or params.seed is not None


class ResponseCache:
    """Successful answers on disk, one JSON file per request: `folder/ab/<sha256>.json`."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @staticmethod
    def key(model: dict[str, Any], prompt: Prompt, params: SamplingParams) -> str:
        # params carries the seed and the budget (`max_tokens`), so a different seed or
        # budget is a different key. The pool asks with one prompt's params, whose
        # `budgets` is empty: left out, it keeps the keys of caches written before it.
        fields = dataclasses.asdict(params)
        if not fields["budgets"]:
            del fields["budgets"]
        blob = json.dumps(
            {"model": model, "prompt": prompt, "params": fields},
            sort_keys=True,
            ensure_ascii=False,
        )
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def path(self, key: str) -> Path:
        # Two-character shards keep any one folder small with millions of entries.
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # missing or damaged: a miss, and the next success rewrites it
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
            return None
        return entry

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Replace the entry atomically (`runs.write_atomic`): readers never see half of
        one. Not synced to disk: a cut-short entry is a miss (`get`), not worth an fsync
        on every answer."""
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            runs.write_atomic(path, json.dumps(entry, ensure_ascii=False), durable=False)
        except OSError as err:  # a full disk must not fail the call that was answered
            log.warning("response cache: cannot write %s: %s", path, err)
