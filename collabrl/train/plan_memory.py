"""The dry run's memory and disk sections: the policy's training memory term by term
(`train/memory.py`'s arithmetic) against this machine's GPU or an 80 GB one, a colocated
vLLM's KV cache, what `eval_steps` holds (refused where it cannot fit) and the disk the
kept checkpoints take."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from collabrl.errors import UserError
from collabrl.train.memory import (
    ASSUMED_GPU_GIB,
    GB,
    GIB,
    PROMPT_TOKENS,
    VLLM_FIXED_GIB,
    MemoryEstimate,
    ModelShape,
    checkpoint_size,
    estimate_eval,
    estimate_memory,
    estimate_vllm,
    model_shape,
    room_for_vllm,
)

if TYPE_CHECKING:
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.plan_rows import Launch, TrainPlan
    from collabrl.train.resolve import ResolvedRun


def memory_section(plan: TrainPlan, run: ResolvedRun, args: Any, launch: Launch) -> None:
    section, config = "memory per device (estimate)", run.config
    shape = model_shape(config.model)
    if shape is None:
        plan.add(section, "policy", "unknown size: no config.json here and no size in its name")
        return
    if shape.source != "config.json":
        plan.warnings.append(
            f"policy '{config.model}' is not on this machine: its size is read from {shape.source}"
        )
    colocated = args.use_vllm and args.vllm_mode == "colocate"
    sequence = (config.max_prompt_tokens or PROMPT_TOKENS) + config.sampling.max_tokens
    terms = functools.partial(
        estimate_memory,
        shape,
        micro_batch=args.per_device_train_batch_size,
        sequence=sequence,
        checkpointing=args.gradient_checkpointing,
        world_size=launch.processes,
        zero_stage=launch.zero_stage,
        vllm_fraction=args.vllm_gpu_memory_utilization if colocated else None,
        reference=args.beta > 0,
        lora=config.lora.enabled,
    )
    # The run's own dtype and LM-head kernel on this machine: fp32 and torch ops on a CPU.
    memory = terms(bf16=args.bf16, triton=cuda())
    dtype = "bf16" if args.bf16 else "fp32"
    tokens = f"{args.per_device_train_batch_size} × {sequence} tokens"
    plan.add(section, "parameters", f"{shape.parameters / 1e9:.2f} B (from {shape.source})")
    trained = "LoRA: the adapter only" if config.lora.enabled else "16 B a parameter"
    plan.add(
        section,
        f"weights + gradients + AdamW ({trained})",
        f"{memory.weights + memory.gradients + memory.optimizer:.1f} GiB",
    )
    plan.add(section, "reference model", _reference_row(memory, args, config))
    for name, value in (
        (f"activations ({tokens}, {dtype})", memory.activations),
        (f"log-probs (TRL's chunked LM head, {tokens})", memory.logits),
    ):
        shown = "unknown (no config.json)" if value is None else f"{value:.1f} GiB"
        plan.add(section, name, shown)
    # What the method trains beside the policy (rSIM's planner), its rows its own.
    memory = dataclasses.replace(memory, planner=run.method.memory_beside(plan, config, args))
    plan.add(section, "training total", f"{memory.training:.1f} GiB")
    on_gpu = memory  # what a GPU holds: the run's own figures, except on a CPU
    if not args.bf16 and not cuda() and "bf16" not in config.trl:
        # Planned here for a GPU: the same run there computes in bf16 (grpo_args).
        on_gpu = dataclasses.replace(terms(bf16=True, triton=True), planner=memory.planner)
        plan.add(section, "training total on a CUDA GPU (bf16)", f"{on_gpu.training:.1f} GiB")
    if memory.vllm_fraction is not None:
        plan.add(section, "colocated vLLM", f"+ {memory.vllm_fraction:.0%} of the device")
    device = _fit(plan, on_gpu)
    if colocated:
        _vllm_section(plan, shape, args, on_gpu, device, sequence)
    if config.eval_steps is not None:
        _eval_section(plan, config, shape, on_gpu, launch, device, sequence)
    _checkpoint_section(plan, config, shape, launch, args)


def _reference_row(memory: MemoryEstimate, args: Any, config: GRPOTrainConfig) -> str:
    """TRL loads a frozen copy of the policy when beta > 0, except under LoRA, where it
    disables the adapter instead."""
    if args.beta == 0:
        return "none (beta 0)"
    if config.lora.enabled:
        return "none (LoRA: the adapter is disabled instead)"
    return f"{memory.reference:.1f} GiB (beta {args.beta})"


def _device() -> tuple[float, str]:
    """GiB of this machine's GPU, else of the 80 GB GPU the paper configs are written
    for, and how the plan names it."""
    if not cuda():
        return ASSUMED_GPU_GIB, "GPU (assumed: none here)"
    import torch

    return torch.cuda.get_device_properties(0).total_memory / GIB, "this GPU"


def _fit(plan: TrainPlan, memory: MemoryEstimate) -> float:
    """Compare training with the GPU (this machine's, or an 80 GB one); its GiB."""
    device, name = _device()
    free = device * (1 - (memory.vllm_fraction or 0.0))
    plan.add("memory per device (estimate)", name, f"{device:.0f} GiB, {free:.0f} GiB for training")
    if memory.training > free:
        plan.warnings.append(
            f"the estimate ({memory.training:.0f} GiB) exceeds what the {device:.0f} GiB GPU "
            f"leaves for training ({free:.0f} GiB)"
        )
    return device


def _vllm_section(
    plan: TrainPlan,
    shape: ModelShape,
    args: Any,
    training: MemoryEstimate,
    device: float,
    sequence: int,
) -> None:
    """The colocated vLLM's KV cache in sequences of its length, beside the sequences a
    generation runs on it at once (TRL's max_num_seqs)."""
    section = "colocated vLLM (estimate)"
    vllm = estimate_vllm(shape, args.vllm_gpu_memory_utilization, device)
    length = args.vllm_max_model_length or sequence
    batch = args.per_device_train_batch_size * args.vllm_tensor_parallel_size
    batch *= args.steps_per_generation or args.gradient_accumulation_steps
    activations = "unknown" if vllm.activations is None else f"{vllm.activations:.1f} GiB"
    plan.add(
        section,
        "its share",
        f"{vllm.fraction:.0%} of {device:.0f} GiB = {vllm.share:.1f} GiB: weights "
        f"{vllm.weights:.1f} GiB (bf16) + profiled activations {activations} + graphs "
        f"and workspaces {VLLM_FIXED_GIB:.0f} GiB + KV cache {vllm.kv_cache:.1f} GiB",
    )
    sequences = vllm.sequences(length)
    if sequences is None or vllm.token_bytes is None:
        plan.add(section, "KV cache", "unknown (no config.json: its heads are not known)")
        return
    plan.add(
        section,
        "KV cache",
        f"{vllm.token_bytes // 1024} KiB a token: {sequences:.1f} sequences of {length} tokens",
    )
    plan.add(
        section,
        "a generation runs at once",
        f"{batch} sequences (TRL's max_num_seqs: micro-batch × tensor parallel × "
        "steps_per_generation)",
    )
    room = room_for_vllm(training.training, device)
    plan.add(
        section, "largest share training leaves", f"{room:.2f} (trl.vllm_gpu_memory_utilization)"
    )
    if sequences < 1:
        plan.warnings.append(
            f"the colocated vLLM's KV cache ({vllm.kv_cache:.1f} GiB at "
            f"{vllm.fraction:.0%} of a {device:.0f} GiB GPU) cannot hold one sequence of "
            f"{length} tokens: vLLM refuses to start (raise trl.vllm_gpu_memory_utilization"
            f"{f' up to {room:.2f}' if room > vllm.fraction else ''})"
        )
    elif sequences < batch:
        remedy = (
            f"raise trl.vllm_gpu_memory_utilization (up to {room:.2f} leaves training its estimate)"
            if room > vllm.fraction
            else "spread the generation over more processes or serve the policy "
            "(trl.vllm_mode: server)"
        )
        plan.warnings.append(
            f"the colocated vLLM's KV cache holds {sequences:.1f} sequences of {length} "
            f"tokens and a generation runs {batch} at once: the others wait, or are "
            f"preempted and recomputed when the running ones grow, so a generation takes "
            f"longer; {remedy}"
        )


def _eval_section(
    plan: TrainPlan,
    config: GRPOTrainConfig,
    shape: ModelShape,
    training: MemoryEstimate,
    launch: Launch,
    device: float,
    sequence: int,
) -> None:
    """What `eval_steps` holds on a GPU: transformers' generate on the live policy, in the
    trainer, beside the training state and a colocated vLLM. Refused when it cannot fit:
    the run would stop with CUDA out of memory at its first evaluation, hours in."""
    section = "periodic evaluation (eval_steps, estimate)"
    rows = config.engine.batch_size
    vllm = (training.vllm_fraction or 0.0) * device
    estimate = estimate_eval(
        shape,
        training,
        rows=rows,
        length=sequence,
        zero_stage=launch.zero_stage,
        bf16=True,  # on a GPU, TRL's bf16 is on (grpo_args)
        vllm=vllm,
    )
    if estimate is None:
        plan.add(section, "memory", "unknown (no config.json)")
        return
    whole = ", gathered whole by ZeRO-3" if launch.zero_stage >= 3 else ""
    plan.add(
        section, "engine", f"transformers' generate on the live policy{whole}, in every process"
    )
    plan.add(
        section,
        "memory per GPU",
        f"{estimate.total:.1f} GiB: training state {estimate.state:.1f} + gathered policy "
        f"{estimate.gathered:.1f} + KV cache of {rows} × {sequence} tokens "
        f"{rows * estimate.row:.1f} (engine.batch_size) + colocated vLLM {estimate.vllm:.1f}",
    )
    if estimate.total <= device:
        return
    fit = estimate.rows_that_fit(device)
    hint = (
        f"set engine.batch_size to {fit} or less"
        if fit >= 1
        else "drop eval_steps (--eval-data alone scores the start and the end)"
    )
    raise UserError(
        f"eval_steps: the periodic evaluation generates with transformers in the trainer "
        f"and needs about {estimate.total:.0f} GiB per GPU, more than its {device:.0f} GiB",
        hint,
    )


def _checkpoint_section(
    plan: TrainPlan, config: GRPOTrainConfig, shape: ModelShape, launch: Launch, args: Any
) -> None:
    """The disk the kept checkpoints take: what `--resume` reads back, × the number kept."""
    section = "disk (estimate)"
    size = checkpoint_size(
        zero_stage=launch.zero_stage,
        bf16=True,  # as on a GPU: DeepSpeed stores bf16 weights there
        lora=config.lora.enabled,
        only_model=bool(args.save_only_model),
    )
    each = shape.parameters * size.per_parameter / GB
    kept = config.save_total_limit
    plan.add(section, "a checkpoint", f"{each:.1f} GB ({size.holds})")
    if kept is None:
        plan.add(section, "checkpoints kept", f"all: one every {config.save_steps} steps")
    else:
        plan.add(section, "checkpoints kept", f"{kept} (save_total_limit) = {each * kept:.1f} GB")
    if args.save_only_model:
        plan.warnings.append(
            "trl.save_only_model: checkpoints hold no optimizer, scheduler or RNG state, "
            "so --resume cannot continue a run from them"
        )


def cuda() -> bool:
    """Whether a CUDA GPU is here: the plan then uses its size and the GPU kernels."""
    import torch

    return torch.cuda.is_available()
