"""The memory and disk a training run takes, estimated without loading a weight: a
model's shape, the trained policy's memory per device term by term, the KV cache a
colocated vLLM keeps, what the periodic evaluation (`eval_steps`) holds on top of
training, and the disk the checkpoints take. `plan.py`, the dry run, shows these figures
as rows; a method that trains something beside the policy adds its own through its spec
(rSIM's planner). Arithmetic, shown term by term: not a measurement
(bench/memory_estimate.py holds it against measured peaks; docs/benchmarks.md has them).

A model's size comes from its config.json (built on torch's meta device); for a folder
that is not on this machine, from the shape shipped for its name
(collabrl/train/shapes/), else from a size in its name.

The trained policy (`estimate_memory`):
- AdamW holds 16 bytes per parameter (fp32 weights, gradients and two moments; ZeRO
  shards them over the processes); with LoRA only the weights, as the adapter is small;
- the reference model, loaded when beta > 0 without LoRA (TRL 1.16 builds it in the
  policy's dtype, fp32 here; DeepSpeed casts it to bf16 and ZeRO-3 shards it);
- the activations autograd saves, per micro-batch at the longest sequence, in the dtype
  the run computes in (bf16 with TRL's bf16, else fp32, as on a CPU);
- TRL's chunked LM head: it never holds the micro-batch × sequence × vocabulary logits,
  only tiles of at most 4096 tokens × 32768 vocabulary entries, plus the fp32 gradient
  of the head's weight;
- a colocated vLLM takes its share of the device on top.

Beside it:
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

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

from collabrl.errors import UserError

# Tokens of prompt assumed in the activation estimate when max_prompt_tokens is unset: no
# data is read in a dry run.
PROMPT_TOKENS = 1024
# Per parameter, mixed-precision AdamW: fp32 weights (4), fp32 gradients (4), two fp32
# moments (8).
WEIGHT_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8
# Tensors autograd saves per token in one Llama/Qwen decoder layer of transformers 5,
# counted with saved-tensor hooks (see docs/benchmarks.md): 10 of the hidden width
# (the norms' inputs and outputs, q, k, v, the attention output, ...) and 4 of the MLP's
# (gate, up, SiLU(gate), their product). The RMSNorms upcast to fp32 whatever the
# compute dtype: 4 of the 10 are fp32 in a bf16 run.
HIDDEN_SAVED, MLP_SAVED, NORM_FP32_SAVED = 10, 4, 4
# TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py) projects tiles of at most
# this many tokens × vocabulary entries. Without Triton (a CPU) each tile is folded by
# torch ops holding about 6 fp32 tile-sized temporaries at once (the backward's); the
# Triton kernel folds a tile in place.
TILE_TOKENS, TILE_VOCAB, TORCH_TILE_TEMPORARIES = 4096, 32768, 6
SHAPES = Path(__file__).parent / "shapes"
_SIZE_IN_NAME = re.compile(r"(\d+(?:\.\d+)?)\s*b(?![a-z])", re.IGNORECASE)
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


def model_shape(ref: str) -> ModelShape | None:
    """The model's size from its config.json, without its weights; when the folder is
    not on this machine, from the shape shipped for its name (`shipped_shape`), else
    from a size in its name (e.g. `Qwen3-1.7B`); None when none of them says."""
    from collabrl.models import resolve_model, weights_dir

    try:
        folder = weights_dir(resolve_model(ref))
    except UserError:
        return shipped_shape(ref) or shape_from_name(ref)
    return shape_from_config(folder)


def shape_from_config(folder: Path) -> ModelShape:
    """Count the parameters of the architecture in `folder` on torch's meta device."""
    from collabrl.models import meta_model

    model = meta_model(folder)
    text = model.config.get_text_config()
    hidden = getattr(text, "hidden_size", None)
    heads = getattr(text, "num_attention_heads", None)
    # Qwen2 and Llama leave head_dim out of config.json: the hidden width over the heads.
    head_dim = getattr(text, "head_dim", None) or (hidden // heads if hidden and heads else None)
    return ModelShape(
        parameters=sum(p.numel() for p in model.parameters()),
        hidden_size=hidden,
        layers=getattr(text, "num_hidden_layers", None),
        vocab_size=getattr(text, "vocab_size", None),
        intermediate_size=getattr(text, "intermediate_size", None),
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
    )


def shipped_shape(ref: str) -> ModelShape | None:
    """The shape shipped in collabrl/train/shapes/ whose name `ref` contains as a whole
    name (case-insensitive; the longest when several do: `Qwen2.5-0.5B-Instruct` is
    `Qwen2.5-0.5B`, `runs/sft-relay-qwen3-1.7b/final` is `Qwen3-1.7B`)."""
    found = [
        folder
        for folder in SHAPES.iterdir()
        if (folder / "config.json").is_file()
        and re.search(rf"(?<![a-z0-9.]){re.escape(folder.name.lower())}(?![a-z0-9.])", ref.lower())
    ]
    if not found:
        return None
    folder = max(found, key=lambda f: len(f.name))
    shape = shape_from_config(folder)
    return dataclasses.replace(shape, source=f"the shipped shape {SHAPES.name}/{folder.name}")


def shape_from_name(ref: str) -> ModelShape | None:
    """A parameter count read from the last `<number>B` in a model path or name."""
    sizes = _SIZE_IN_NAME.findall(ref)
    if not sizes:
        return None
    return ModelShape(parameters=int(float(sizes[-1]) * 1e9), source="its name")


def estimate_memory(
    shape: ModelShape,
    *,
    micro_batch: int,
    sequence: int,
    checkpointing: bool,
    world_size: int,
    zero_stage: int,
    vllm_fraction: float | None,
    bf16: bool = True,
    reference: bool = False,
    lora: bool = False,
    triton: bool = True,
) -> MemoryEstimate:
    """GiB per device of training `shape` (see the module's note for the terms). ZeRO
    stage 1 shards the optimizer state over `world_size` processes, 2 the gradients too,
    3 the weights (and the reference model) too. `bf16`: the run computes in bf16 (TRL's
    bf16), else in fp32; `reference`: a reference model is loaded (beta > 0 without
    LoRA); `lora`: only an adapter trains; `triton`: the LM head's tiles are folded by
    TRL's Triton kernel (a GPU), else by torch ops (a CPU)."""
    params = shape.parameters
    compute = 2 if bf16 else 4
    # DeepSpeed with bf16 casts the models to bf16 (its optimizer keeps the fp32 master
    # copy); otherwise they stay fp32 and autocast leaves the residual stream in fp32.
    stored = 2 if bf16 and zero_stage > 0 else 4

    def sharded(bytes_per_param: int, from_stage: int) -> float:
        share = world_size if zero_stage >= from_stage else 1
        return params * bytes_per_param / share / GIB

    trained = 0 if lora else 1  # a LoRA adapter's state is a fraction of a percent
    activations = logits = None
    tokens = micro_batch * sequence
    if shape.hidden_size and shape.layers:
        hidden, mlp = shape.hidden_size, shape.intermediate_size or 4 * shape.hidden_size
        full_layer = (HIDDEN_SAVED * hidden + MLP_SAVED * mlp) * compute
        full_layer += NORM_FP32_SAVED * hidden * (4 - compute)
        if checkpointing:  # each layer's input, and the one being recomputed in full
            activations = tokens * (shape.layers * hidden * stored + full_layer) / GIB
        else:
            activations = tokens * shape.layers * full_layer / GIB
    if shape.vocab_size and shape.hidden_size:
        tile = min(tokens, TILE_TOKENS) * min(shape.vocab_size, TILE_VOCAB)
        tile_bytes = compute + (0 if triton else TORCH_TILE_TEMPORARIES * 4)
        # The backward accumulates the head's gradient and the hidden states' in fp32.
        head_grad = (shape.vocab_size + tokens) * shape.hidden_size * 4
        logits = (tile * tile_bytes + head_grad) / GIB
    return MemoryEstimate(
        weights=sharded(WEIGHT_BYTES, 3),
        gradients=sharded(GRAD_BYTES * trained, 2),
        optimizer=sharded(ADAM_BYTES * trained, 1),
        activations=activations,
        logits=logits,
        reference=sharded(stored, 3) if reference and not lora else 0.0,
        vllm_fraction=vllm_fraction,
    )
