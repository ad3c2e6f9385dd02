"""Models where users keep them, through the real `collab` script: hub names from the
local Hugging Face cache, and `serve --engine vllm --dry-run` with no weights here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collabrl.cli.main import app
from collabrl.engines.vllm import installed_vllm
from collabrl.serve.vllm_launcher import server_entry_point
from tests.cli.test_cli import assert_one_line_error, collab
from tests.test_models_hub_cache import REPO, fake_hub_cache

SERVE_VLLM = ("serve", "expert", "--engine", "vllm", "--dry-run", "--model")


def _entry(model_path: str) -> list[str]:
    """`vllm serve PATH`, or with vLLM's CPU build installed its module entry point."""
    return server_entry_point(model_path, (installed_vllm() or ("vllm", None))[0])


def test_train_dry_run_reads_a_hub_model_from_the_cache(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub_cache(tmp_path / "hub", REPO, tiny_model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    args = ["train", "grpo", "--dry-run", "--model", REPO, "--data", "arith_train"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})  # in-process: fast
    assert result.exit_code == 0, result.output
    assert "not on this machine" not in result.output
    assert "(from config.json)" in result.output  # its size, read from the cached config


def test_serve_vllm_dry_run_serves_the_cached_snapshot(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    snapshot = fake_hub_cache(tmp_path / "hub", REPO, tiny_model_dir)
    result = collab(*SERVE_VLLM, REPO, cwd=tmp_path, env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert result.returncode == 0, result.stderr
    entry = _entry(str(snapshot.resolve()))
    assert result.stdout.split()[: len(entry)] == entry


def test_an_uncached_hub_name_is_one_line_saying_where_it_looked(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    result = collab(
        "serve", "expert", "--engine", "transformers", "--model", "Qwen/Qwen2.5-0.5B-Instruct",
        cwd=tmp_path, env={"HF_HUB_CACHE": str(cache)},
    )  # fmt: skip
    assert_one_line_error(
        result, "unknown model 'Qwen/Qwen2.5-0.5B-Instruct'", str(cache), "nothing is downloaded"
    )


def test_serve_vllm_dry_run_needs_no_weights(tmp_path: Path) -> None:
    # The README's example, from a machine without the 32B weights.
    result = collab(*SERVE_VLLM, "./QwQ-32B", "--tensor-parallel-size", "8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    entry = _entry("./QwQ-32B")
    assert words[: len(entry)] == entry
    assert words[words.index("--tensor-parallel-size") + 1] == "8"
    warning = result.stderr.strip()
    assert warning.startswith("warning: unknown model './QwQ-32B'"), warning
    assert len(warning.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing converted


def test_serve_without_dry_run_still_refuses_a_missing_model(tmp_path: Path) -> None:
    result = collab("serve", "expert", "--engine", "vllm", "--model", "./QwQ-32B", cwd=tmp_path)
    assert_one_line_error(result, "unknown model './QwQ-32B'")


def test_a_damaged_cached_model_is_one_line_and_leaves_no_run_folder(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Before: eval wrote its folder, then failed with a safetensors traceback."""
    snapshot = fake_hub_cache(tmp_path / "hub", REPO, tiny_model_dir)
    blob = (snapshot / "model.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:4096])  # a download cut off
    args = ["eval", "run", "arith", "--model", REPO, "--limit", "1", "--out", "run"]
    result = collab(*args, cwd=tmp_path, env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    # Named with the commit the run pinned it to: the snapshot that is damaged.
    where = f"'{REPO}@{snapshot.name}': model.safetensors in"
    assert_one_line_error(result, where, "is cut short")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_ref_that_is_no_regular_file_is_refused_unread(
    kind: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Before, huggingface_hub opened refs/main: a FIFO blocked forever, /dev/zero was read
    until memory ran out (here: the process timeout)."""
    fake_hub_cache(tmp_path / "hub", REPO, tiny_model_dir)
    ref = tmp_path / "hub" / "models--tiny-org--tiny-llama" / "refs" / "main"
    ref.unlink()
    if kind == "fifo":
        os.mkfifo(ref)
    else:
        ref.symlink_to("/dev/zero")
    args = ["eval", "run", "arith", "--model", REPO, "--limit", "1", "--out", "run"]
    env = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    result = collab(*args, cwd=tmp_path, env=env, timeout=60)
    assert_one_line_error(result, f"'{REPO}': cannot read cache ref {ref}: not a regular file")
    assert not (tmp_path / "run").exists()
