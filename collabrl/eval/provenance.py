"""What tells one eval run from another by its files alone: hashes of each sample's
problem, prompt and gold answer (lm-eval's `doc_hash`, `prompt_hash`, `target_hash`), of
the data and of the whole task, the policy's chat template, and the commit of the
collabrl that ran.

Every hash is the SHA-256 of a value's canonical JSON (sorted keys), in hex, as lm-eval
hashes its strings: equal values give equal hashes on any machine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import collabrl
from collabrl import runs
from collabrl.data.benchmarks import Item
from collabrl.engines import is_url
from collabrl.errors import UserError

# The per-sample hashes, in the order lm-eval writes them; a task's hash joins them.
SAMPLE_HASHES = ("doc_hash", "prompt_hash", "target_hash")


def digest(value: Any) -> str:
    """SHA-256 of `value` as canonical JSON (text as it is, keys sorted), in hex."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sample_hashes(item: Item, prompt: Any, prompt_ids: list[int]) -> dict[str, str]:
    """A sample's three hashes: its problem row, the prompt it was sent (the messages and,
    where the policy has a tokenizer, their ids, which the chat template shapes) and its
    gold answer."""
    return {
        "doc_hash": digest(asdict(item)),
        "prompt_hash": digest({"messages": prompt, "ids": prompt_ids}),
        "target_hash": digest(item.answer),
    }


def data_hash(items: list[Item]) -> str:
    """The hash of a benchmark's rows as evaluated (after `--limit`), in order."""
    return digest([asdict(item) for item in items])


def task_hash(records: list[dict[str, Any]]) -> str | None:
    """lm-eval's task hash: one hash over every sample's three, in the samples' order;
    None when a sample was written before they were recorded."""
    if not all(key in r for r in records for key in SAMPLE_HASHES):
        return None
    return digest("".join(r[key] for r in records for key in SAMPLE_HASHES))


def chat_template(model: str, tokenizer: str | None) -> str | None:
    """The chat template the policy's prompts were rendered with: its tokenizer's (the
    model's own, or `--tokenizer`'s); None for an endpoint without `--tokenizer`, whose
    server applies a template it does not tell, and for a name no model here answers to."""
    ref = tokenizer or model
    if is_url(ref):
        return None
    from collabrl.models import load_tokenizer, resolve_model

    try:
        resolved = resolve_model(ref)
    except UserError:
        # A caller's own engine under a name that is no model here (a test's scripted
        # policy): its template is not known.
        return None
    template = load_tokenizer(resolved).chat_template
    # A tokenizer may hold several named templates: all of them, as one JSON text.
    return json.dumps(template, sort_keys=True) if isinstance(template, dict) else template


def collabrl_commit() -> str | None:
    """The commit of the collabrl that runs: the one pip recorded for an install from a
    git URL (`direct_url.json`'s `vcs_info`), else that of the checkout an editable or
    source install runs from (`+dirty` with uncommitted changes); None for a wheel, which
    `versions.collabrl` names. The working directory's repository is the user's, not ours."""
    try:
        direct = distribution("collabrl").read_text("direct_url.json")
    except PackageNotFoundError:  # run from a source tree that was never installed
        direct = None
    commit = (json.loads(direct).get("vcs_info") or {}).get("commit_id") if direct else None
    if commit:
        return commit
    checkout = Path(collabrl.__file__).resolve().parent.parent
    # Only the checkout's own repository: site-packages inside some project's repository
    # (a virtual environment in it) would give that project's commit.
    return runs.git_commit(checkout) if (checkout / ".git").exists() else None
