"""The dry run's memory and disk records (a model's shape, the trained policy's estimate,
which `plan.estimate_memory` fills) and its arithmetic beyond the policy's own memory:
the KV cache a colocated vLLM keeps, what the periodic evaluation (`eval_steps`) holds
on top of training, and the disk the checkpoints take. Arithmetic, as `plan.py`'s
estimate is, shown term by term: not a measurement.

- A colocated vLLM takes `vllm_gpu_memory_utilization` of the GPU and keeps its weights
  (16-bit, as the paper checkpoints ship), the activations of the forward pass it
  profiles at start (TRL builds it with 4096 batched tokens) and CUDA graphs and
  workspaces (about 1 GiB); the rest is its KV cache, 2 (K and V) × layers × KV heads ×
  head width × 2 bytes a token. In sequences of its length, that is the "Maximum
  concurrency" vLLM logs when it starts; TRL lets it run up to micro-batch × tensor
  parallel × steps_per_generation sequences at once (its `max_num_seqs`).
- `eval_steps` evaluates with transformers' `generate` on the live policy, in the
  trainer: ZeRO-3 gathers the whole policy for it, each of `engine.batch_size` rows
  keeps a KV cache of up to the prompt and `sampling.max_tokens`, and the training state
  and a colocated vLLM stay where they are.
- A checkpoint holds what `--resume` reads back: the weights and AdamW's state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3
GB = 10**9  # disks are sold, and `df -H` counts, in decimal gigabytes

# An 80 GB A100 or H100 as CUDA reports it (about 79.2 GiB): the GPU a dry run on a
# machine without one plans for, the one the paper configs are written for.
ASSUMED_GPU_GIB = 79.2

# vLLM keeps weights and KV cache in the checkpoint's 16-bit dtype.
VLLM_BYTES = 2
# TRL builds its colocated vLLM with max_num_batched_tokens 4096; vLLM profiles a forward
# pass of that many tokens before it sizes the KV cache.
VLLM_BATCHED_TOKENS = 4096
# CUDA graphs, cuBLAS and NCCL workspaces: vLLM's "non-torch memory" and graph pool.
VLLM_FIXED_GIB = 1.0


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model; the sizes are unknown (None) when only the
    parameter count could be read off the name."""

    parameters: int
    hidden_size: int | None = None
    layers: int | None = None
    vocab_size: int | None = None
    intermediate_size: int | None = None
    kv_heads: int | None = None  # attention's key/value heads (grouped-query attention)
    head_dim: int | None = None
    source: str = "config.json"


@dataclass(frozen=True)
class MemoryEstimate:
    """GiB per device for the trained policy, term by term, with the vLLM share apart."""

    weights: float
    gradients: float
    optimizer: float
    activations: float | None  # None: the model's shape is unknown
    logits: float | None  # TRL's chunked LM head: tiles and the head's fp32 gradient
    reference: float = 0.0  # the frozen reference model (beta > 0, no LoRA)
    vllm_fraction: float | None = None  # a colocated vLLM's share of the device
    planner: float = 0.0  # rsim: the planner trained beside the policy, unsharded

    @property
    def training(self) -> float:
        return (
            self.planner
            + self.weights
            + self.gradients
            + self.optimizer
            + self.reference
            + (self.activations or 0.0)
            + (self.logits or 0.0)
        )


def kv_token_bytes(shape: ModelShape, dtype_bytes: int) -> int | None:
    """The KV cache of one token: K and V of every layer's KV heads; None when the
    shape is known only by its parameter count."""
    if not (shape.layers and shape.kv_heads and shape.head_dim):
        return None
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes


@dataclass(frozen=True)
class VLLMEstimate:
    """A colocated vLLM's share of a `device`-GiB GPU, term by term (GiB)."""

    device: float
    fraction: float
    weights: float
    activations: float | None  # None: the shape is unknown
    token_bytes: int | None  # of KV cache; None: the shape is unknown

    @property
    def share(self) -> float:
        return self.fraction * self.device

    @property
    def kv_cache(self) -> float:
        return max(self.share - self.weights - (self.activations or 0.0) - VLLM_FIXED_GIB, 0.0)

    def sequences(self, length: int) -> float | None:
        """How many sequences of `length` tokens the KV cache holds at once."""
        if self.token_bytes is None:
            return None
        return self.kv_cache * GIB / (length * self.token_bytes)


def estimate_vllm(shape: ModelShape, fraction: float, device: float) -> VLLMEstimate:
    """The colocated vLLM of `shape` at `fraction` of a `device`-GiB GPU (one GPU: the
    colocated engine runs at tensor parallel 1, `grpo_args.check_colocated_tensor_parallel`)."""
    activations = None
    if shape.hidden_size:
        # The profiled pass's widest moment: the MLP's gate and up projections and their
        # product, beside a few hidden-wide buffers (residual, norm, attention output).
        mlp = shape.intermediate_size or 4 * shape.hidden_size
        per_token = (3 * mlp + 4 * shape.hidden_size) * VLLM_BYTES
        activations = VLLM_BATCHED_TOKENS * per_token / GIB
    return VLLMEstimate(
        device=device,
        fraction=fraction,
        weights=shape.parameters * VLLM_BYTES / GIB,
        activations=activations,
        token_bytes=kv_token_bytes(shape, VLLM_BYTES),
    )


def room_for_vllm(training: float, device: float) -> float:
    """The largest `vllm_gpu_memory_utilization`, in steps of 0.05, that leaves a
    `device`-GiB GPU `training` GiB; 0 when training alone does not fit."""
    return max(math.floor(20 * (device - training) / device) / 20, 0.0)


@dataclass(frozen=True)
class EvalEstimate:
    """GiB per GPU while `eval_steps` generates with transformers in the trainer."""

    state: float  # the training state that stays: weights, AdamW, ZeRO-3's gradients
    gathered: float  # the whole policy, gathered by ZeRO-3 for generate (else 0)
    row: float  # one row's KV cache at the full length
    rows: int  # engine.batch_size: rows generated together
    vllm: float  # a colocated vLLM's share, which it keeps

    @property
    def total(self) -> float:
        return self.state + self.gathered + self.rows * self.row + self.vllm

    def rows_that_fit(self, device: float) -> int:
        """The most rows a `device`-GiB GPU holds beside the rest."""
        room = device - self.state - self.gathered - self.vllm
        return max(math.floor(room / self.row), 0) if self.row else self.rows


def estimate_eval(
    shape: ModelShape,
    memory: MemoryEstimate,
    *,
    rows: int,
    length: int,
    zero_stage: int,
    bf16: bool,
    vllm: float,
) -> EvalEstimate | None:
    """The periodic evaluation of `shape` trained as `memory` says: `rows` sequences of up
    to `length` tokens, `vllm` GiB kept by a colocated vLLM; None when the shape is known
    only by its parameter count. DeepSpeed with bf16 holds the policy in bf16, otherwise
    it stays fp32 (and generates in fp32, outside the training step's autocast)."""
    width = 2 if bf16 and zero_stage > 0 else 4
    token = kv_token_bytes(shape, width)
    if token is None:
        return None
    # PyTorch frees the gradients after each step (set to None); ZeRO-3 keeps its
    # partitioned gradient buffer.
    gradients = memory.gradients if zero_stage >= 3 else 0.0
    return EvalEstimate(
        state=memory.weights + memory.optimizer + memory.reference + gradients,
        gathered=shape.parameters * width / GIB if zero_stage >= 3 else 0.0,
        row=length * token / GIB,
        rows=rows,
        vllm=vllm,
    )


@dataclass(frozen=True)
class CheckpointSize:
    """The bytes a checkpoint takes per trained parameter, and what they are."""

    per_parameter: int
    holds: str


def checkpoint_size(*, zero_stage: int, bf16: bool, lora: bool, only_model: bool) -> CheckpointSize:
    """What one checkpoint of the policy holds. Without DeepSpeed: transformers' fp32
    weights and the two AdamW moments. Under DeepSpeed: the weights in its dtype (bf16
    with TRL's bf16), once under ZeRO-3 (`zero3_save_16bit_model`) and twice under
    ZeRO-1/2 (transformers' file and DeepSpeed's module states), and the optimizer's fp32
    master weights and two moments (12 bytes). `only_model` (TRL's `save_only_model`):
    the weights alone. A LoRA run saves its adapter, a fraction of a percent."""
    if lora:
        return CheckpointSize(0, "the LoRA adapter and its AdamW state (small)")
    width = 2 if bf16 and zero_stage > 0 else 4
    copies = 2 if zero_stage in (1, 2) and not only_model else 1
    weights = f"{'bf16' if width == 2 else 'fp32'} weights {width * copies} B"
    if only_model:
        return CheckpointSize(width, f"{weights} (save_only_model: no optimizer state)")
    optimizer = 12 if zero_stage > 0 else 8
    state = "fp32 master weights and AdamW moments" if zero_stage > 0 else "AdamW moments"
    return CheckpointSize(
        width * copies + optimizer, f"{weights} + {state} {optimizer} B a parameter"
    )
