"""The hashes and the commit results.json records (collabrl/eval/provenance.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import collabrl
from collabrl.data.benchmarks import load_benchmark
from collabrl.eval import provenance
from collabrl.eval.provenance import collabrl_commit, data_hash, digest, sample_hashes, task_hash

CHECKOUT = Path(collabrl.__file__).resolve().parent.parent


def test_a_digest_is_of_the_value_not_of_its_key_order() -> None:
    assert digest({"a": 1, "b": [2, "é"]}) == digest({"b": [2, "é"], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})
    assert len(digest("x")) == 64


def test_sample_hashes_tell_problems_prompts_and_answers_apart() -> None:
    first, second = load_benchmark("gsm8k", limit=2).items
    prompt = [{"role": "user", "content": first.problem}]
    base = sample_hashes(first, prompt, [1, 2, 3])
    assert base == sample_hashes(first, prompt, [1, 2, 3])
    # The same messages rendered by another chat template are another prompt.
    assert sample_hashes(first, prompt, [1, 2, 4])["prompt_hash"] != base["prompt_hash"]
    other = sample_hashes(second, prompt, [1, 2, 3])
    assert other["doc_hash"] != base["doc_hash"] and other["target_hash"] != base["target_hash"]
    assert data_hash([first]) != data_hash([first, second])


def test_a_task_hash_needs_every_samples_hashes() -> None:
    item = load_benchmark("gsm8k", limit=1).items[0]
    records = [sample_hashes(item, None, []) for _ in range(2)]
    assert task_hash(records) == task_hash([dict(r) for r in records])
    assert task_hash([*records, {"item_id": item.id}]) is None  # a sample from before them


def test_the_commit_is_the_checkouts_wherever_the_command_runs(tmp_path, monkeypatch) -> None:
    if not (CHECKOUT / ".git").exists():
        pytest.skip("collabrl does not run from a git checkout here")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.chdir(tmp_path)  # outside any repository
    commit = collabrl_commit()
    assert commit is not None and commit.removesuffix("+dirty") == head


class _Installed:
    """What importlib.metadata gives of an install: its direct_url.json's text."""

    def __init__(self, direct_url: dict | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


def test_an_install_from_a_git_url_gives_pips_commit(monkeypatch) -> None:
    vcs = {
        "url": "https://example.org/collabrl.git",
        "vcs_info": {"vcs": "git", "commit_id": "ab12"},
    }
    monkeypatch.setattr(provenance, "distribution", lambda name: _Installed(vcs))
    assert collabrl_commit() == "ab12"


def test_a_wheel_outside_a_checkout_has_no_commit(tmp_path, monkeypatch) -> None:
    """site-packages inside some project's repository must not give that project's commit."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    package = tmp_path / "venv" / "site-packages" / "collabrl"
    package.mkdir(parents=True)
    monkeypatch.setattr(provenance, "distribution", lambda name: _Installed(None))
    monkeypatch.setattr(provenance.collabrl, "__file__", str(package / "__init__.py"))
    assert collabrl_commit() is None
