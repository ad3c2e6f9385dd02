"""`auto` device and dtype: resolved against the machine torch sees (GPUs faked here)."""

from __future__ import annotations

import pytest
import torch

from collabrl.config import EngineConfig
from collabrl.devices import check_device, check_dtype, resolve_device, resolve_dtype
from collabrl.errors import UserError


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int, bf16: bool = True) -> None:
    """Make torch report `count` CUDA GPUs (bf16-capable or not) without touching one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)


def test_auto_is_the_gpu_when_torch_sees_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 1)
    assert resolve_device("auto") == "cuda"


def test_auto_is_the_cpu_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 0)
    assert resolve_device("auto") == "cpu"


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_a_named_device_is_kept(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    _gpus(monkeypatch, 2)
    assert resolve_device(device) == device


def test_cuda_without_a_gpu_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 0)
    with pytest.raises(UserError, match="torch sees none") as err:
        resolve_device("cuda")
    assert err.value.fix == "use cpu or auto"


def test_a_gpu_index_past_the_last_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 2)
    with pytest.raises(UserError, match="torch sees 2 CUDA GPU"):
        resolve_device("cuda:2")


@pytest.mark.parametrize(
    ("bf16", "device", "expected"),
    [(True, "cuda", "bfloat16"), (False, "cuda", "float16"), (True, "cpu", "float32")],
)
def test_auto_dtype_follows_the_device(
    monkeypatch: pytest.MonkeyPatch, bf16: bool, device: str, expected: str
) -> None:
    _gpus(monkeypatch, 1, bf16=bf16)
    assert resolve_dtype("auto", device) == expected


def test_a_named_dtype_is_kept_on_any_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 1)
    assert resolve_dtype("float32", "cuda") == "float32"
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "", "meta", "CPU"])
def test_device_names_torch_cannot_load_onto_are_one_line_errors(device: str) -> None:
    with pytest.raises(UserError, match=r"^engine\.device must be auto, cpu, cuda") as err:
        check_device(device, "engine.device")
    assert "\n" not in str(err.value.problem)


def test_an_unknown_dtype_names_its_key() -> None:
    with pytest.raises(UserError, match=r"^engine\.dtype must be auto, float32"):
        check_dtype("int3", "engine.dtype")


def test_engine_defaults_are_auto_and_checked() -> None:
    config = EngineConfig()
    assert (config.device, config.dtype) == ("auto", "auto")
    config.check()
    with pytest.raises(UserError, match=r"^engine\.device must be"):
        EngineConfig(device="gpu").check()
