"""Counting the bytes autograd keeps for the backward pass, without a GPU: what a
training step's activations weigh, measured on the CPU."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


class SavedActivations:
    """Bytes of the tensors autograd keeps for backward while a block runs: live now,
    and at their peak. Parameters, saved by reference, are not activations: left out."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.live = self.peak = 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> SavedActivations:
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)

    def _pack(self, tensor: torch.Tensor) -> object:
        if tensor.untyped_storage().data_ptr() in self.params:
            return tensor
        box = _Saved(tensor)
        size = tensor.numel() * tensor.element_size()
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(box, self._free, size)  # when backward frees the graph
        return box

    def _free(self, size: int) -> None:
        self.live -= size

    @staticmethod
    def _unpack(packed: object) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Saved) else packed


@dataclass
class _Saved:
    tensor: torch.Tensor
