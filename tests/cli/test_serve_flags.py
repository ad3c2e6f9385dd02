"""`collab serve --engine vllm --dry-run`: vLLM's engine flags pass through as given,
and nothing is forced (the printed line is the `vllm serve` command)."""

from __future__ import annotations

import shlex
from pathlib import Path

from collabrl.engines.vllm import installed_vllm
from collabrl.serve.vllm_launcher import server_entry_point
from tests.cli.test_cli import assert_one_line_error, collab

MODEL = "/cluster/models/QwQ-32B"  # not on this machine: a dry run names it as typed


def _dry_run(tmp_path: Path, *flags: str) -> list[str]:
    """The flags after the server's entry point, in the printed command."""
    result = collab(
        "serve", "expert", "--engine", "vllm", "--model", MODEL, "--dry-run", *flags, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if MODEL in line]
    distribution = (installed_vllm() or ("vllm", None))[0]
    entry = server_entry_point(MODEL, distribution)
    words = shlex.split(line)
    assert words[: len(entry)] == entry
    return words[len(entry) :]


def _value(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


def test_vllms_flags_pass_through(tmp_path: Path) -> None:
    words = _dry_run(
        tmp_path,
        "--max-model-len", "4096",
        "--gpu-memory-utilization", "0.5",
        "--dtype", "bfloat16",
        "--enforce-eager",
        "--trust-remote-code",
        "--tensor-parallel-size", "2",
    )  # fmt: skip
    assert _value(words, "--max-model-len") == "4096"
    assert _value(words, "--gpu-memory-utilization") == "0.5"
    assert _value(words, "--dtype") == "bfloat16"
    assert _value(words, "--tensor-parallel-size") == "2"
    assert "--enforce-eager" in words and "--trust-remote-code" in words


def test_nothing_is_forced(tmp_path: Path) -> None:
    """No 32768-token context, no 0.8 of the GPU, no remote code: vLLM's defaults rule."""
    words = _dry_run(tmp_path)
    for flag in (
        "--max-model-len",
        "--gpu-memory-utilization",
        "--tensor-parallel-size",
        "--enforce-eager",
        "--trust-remote-code",
    ):
        assert flag not in words, words
    if installed_vllm() is None or installed_vllm()[0] == "vllm":
        assert "--dtype" not in words  # the CPU build's `auto` is float32 (docs/serving.md)


def test_a_context_length_below_one_is_refused(tmp_path: Path) -> None:
    result = collab("serve", "expert", "--max-model-len", "0", "--dry-run", cwd=tmp_path)
    assert_one_line_error(result, "--max-model-len", "at least 1")
