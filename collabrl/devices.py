"""Where a local model runs, and in which dtype: `auto` resolved against this machine.

`engine.device` and `engine.dtype` (and `collab serve`'s `device` and `dtype`) default
to `auto`: the first visible CUDA GPU when torch sees one, otherwise the CPU; bfloat16
on a GPU that computes in it natively, float16 on an older GPU, float32 on a CPU (where
bfloat16 ran several times slower: docs/benchmarks.md). A name given explicitly is kept,
once checked. The checks only parse names, so a config can be refused before any model
or GPU is touched; `resolve_device` also refuses a CUDA device torch cannot see.
"""

from __future__ import annotations

from collabrl.errors import UserError, require

AUTO = "auto"
DTYPES = ("float32", "bfloat16", "float16")
# The kinds of torch device a model is generated on; torch parses many more (meta, xla, …).
DEVICE_TYPES = ("cpu", "cuda", "mps")


def check_device(device: str, key: str = "device") -> None:
    """Refuse a device name no engine can load onto (one line naming `key`): it must be
    auto, cpu, cuda, cuda:N or mps. The hardware is not looked at."""
    if device == AUTO:
        return
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = None
    require(key, device, kind in DEVICE_TYPES, "auto, cpu, cuda, cuda:N or mps")


def check_dtype(dtype: str, key: str = "dtype") -> None:
    """Refuse a weights dtype no engine loads (one line naming `key`)."""
    require(key, dtype, dtype in (AUTO, *DTYPES), f"{AUTO}, {', '.join(DTYPES)}")


def resolve_device(device: str) -> str:
    """The torch device a model is loaded onto: `auto` is cuda when torch sees a GPU (the
    process's current one: under `accelerate launch`, its own), else cpu. A CUDA device
    torch cannot see is refused here, before any weights are read."""
    import torch

    check_device(device)
    if device == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    parsed = torch.device(device)
    if parsed.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise UserError(
            f"device '{device}' needs a CUDA GPU, and torch sees none", "use cpu or auto"
        )
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise UserError(
            f"device '{device}' does not exist: torch sees {count} CUDA GPU(s)",
            f"use cuda:0 to cuda:{count - 1}, or auto",
        )
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """The weights dtype on `device` (already resolved): `auto` is bfloat16 on a CUDA GPU
    that computes in it natively, float16 on an older one, float32 anywhere else. Other
    names are returned as they are (`check_dtype` refuses unknown ones in configs, the
    model loader at load time)."""
    if dtype != AUTO:
        return dtype
    import torch

    parsed = torch.device(device)
    if parsed.type != "cuda":
        return "float32"
    return "bfloat16" if _native_bf16(parsed.index) else "float16"


def _native_bf16(index: int | None) -> bool:
    """Whether CUDA GPU `index` (None: the current one) computes in bfloat16 natively;
    emulated bfloat16 (pre-Ampere) is slower than float16."""
    import torch

    if index is None:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    with torch.cuda.device(index):
        return torch.cuda.is_bf16_supported(including_emulation=False)
