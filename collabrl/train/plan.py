"""`collab train METHOD --dry-run`: a run resolved without loading a weight.

What a researcher checks before taking a config to a cluster: the settings as TRL will
read them (not as the YAML spells them), the batch and group sizes per process and
overall, every collaborator and where it runs, and a memory estimate per device. The
config's own checks run first, so an inconsistent config is refused with one line here
as it would be at launch. Nothing is contacted and no weight is read: a model's size
comes from its config.json (built on torch's meta device) or, for a folder that is not
on this machine, from a size in its name.

The memory estimate is arithmetic, shown with its terms, not a measurement: AdamW in
mixed precision holds 16 bytes per parameter (fp32 weights, gradients and two moments;
ZeRO shards them over the processes), activations are counted per micro-batch at the
longest sequence, and a colocated vLLM takes its share of the device on top.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl.engines import is_url
from collabrl.errors import UserError
from collabrl.protocols import registry

if TYPE_CHECKING:
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.train.grpo_config import GRPOTrainConfig

GIB = 1024**3
# Tokens of prompt assumed in the activation estimate: no data is read in a dry run.
PROMPT_TOKENS = 1024
# Per parameter, mixed-precision AdamW: fp32 weights (4), fp32 gradients (4), two fp32
# moments (8).
WEIGHT_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8
# Activation bytes per token, hidden unit and layer: one bf16 hidden state per layer
# kept with checkpointing; about 34 without (a transformer layer's saved tensors in
# half precision, flash attention's score matrices not counted).
CHECKPOINTED_BYTES, FULL_LAYER_BYTES = 2, 34
_SIZE_IN_NAME = re.compile(r"(\d+(?:\.\d+)?)\s*b(?![a-z])", re.IGNORECASE)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a model; the three sizes are unknown (None) when only
    the parameter count could be read off the name."""

    parameters: int
    hidden_size: int | None = None
    layers: int | None = None
    vocab_size: int | None = None
    source: str = "config.json"


@dataclass(frozen=True)
class MemoryEstimate:
    """GiB per device for the trained policy, with the vLLM share apart."""

    weights: float
    gradients: float
    optimizer: float
    activations: float | None  # None: the model's shape is unknown
    logits: float | None
    vllm_fraction: float | None = None  # a colocated vLLM's share of the device
    planner: float = 0.0  # rsim: the planner trained beside the policy, unsharded

    @property
    def training(self) -> float:
        return (
            self.planner
            + self.weights
            + self.gradients
            + self.optimizer
            + (self.activations or 0.0)
            + (self.logits or 0.0)
        )


@dataclass
class TrainPlan:
    """Titled sections of (setting, value) rows, and the warnings to show under them."""

    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def add(self, section: str, key: str, value: object) -> None:
        self.sections.setdefault(section, []).append((key, str(value)))


def model_shape(ref: str) -> ModelShape | None:
    """The model's size from its config.json, without its weights; from its name (e.g.
    `Qwen3-1.7B`) when the folder is not on this machine; None when neither says."""
    from collabrl.models import resolve_model, weights_dir

    try:
        folder = weights_dir(resolve_model(ref))
    except UserError:
        return shape_from_name(ref)
    return shape_from_config(folder)


def shape_from_config(folder: Path) -> ModelShape:
    """Count the parameters of the architecture in `folder` on torch's meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    return ModelShape(
        parameters=sum(p.numel() for p in model.parameters()),
        hidden_size=getattr(text, "hidden_size", None),
        layers=getattr(text, "num_hidden_layers", None),
        vocab_size=getattr(text, "vocab_size", None),
    )


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
) -> MemoryEstimate:
    """GiB per device of training `shape` (see the module's note for the terms). ZeRO
    stage 1 shards the optimizer state over `world_size` processes, 2 the gradients too,
    3 the weights too."""
    params = shape.parameters

    def sharded(bytes_per_param: int, from_stage: int) -> float:
        share = world_size if zero_stage >= from_stage else 1
        return params * bytes_per_param / share / GIB

    activations = logits = None
    if shape.hidden_size and shape.layers:
        per_layer = CHECKPOINTED_BYTES if checkpointing else FULL_LAYER_BYTES
        tokens = micro_batch * sequence
        activations = tokens * shape.hidden_size * shape.layers * per_layer / GIB
        if checkpointing:  # the one layer being recomputed holds its full activations
            activations += tokens * shape.hidden_size * FULL_LAYER_BYTES / GIB
    if shape.vocab_size:
        logits = micro_batch * sequence * shape.vocab_size * 4 / GIB  # fp32 log-softmax
    return MemoryEstimate(
        weights=sharded(WEIGHT_BYTES, 3),
        gradients=sharded(GRAD_BYTES, 2),
        optimizer=sharded(ADAM_BYTES, 1),
        activations=activations,
        logits=logits,
        vllm_fraction=vllm_fraction,
    )


@dataclass(frozen=True)
class Launch:
    """How many processes train, and how ZeRO shards them (0: no sharding)."""

    processes: int = 1
    zero_stage: int = 0
    source: str = "one process"


def launch_of(accelerate_config: Path | None) -> Launch:
    """The launch a dry run stands for: the processes and ZeRO stage of an accelerate
    config file (the one `accelerate launch --config_file` will get; FSDP's full shard
    counts as stage 3), else of the running launch ($WORLD_SIZE), else one process."""
    if accelerate_config is not None:
        return _launch_from_file(accelerate_config)
    world = os.environ.get("WORLD_SIZE")
    if world is None:
        return Launch()
    stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0")
    return Launch(int(world), int(stage), "this accelerate launch")


def _launch_from_file(path: Path) -> Launch:
    from collabrl.config import read_yaml

    data = read_yaml(path)
    processes = data.get("num_processes", 1)
    if not isinstance(processes, int) or processes < 1:
        raise UserError(f"{path}: num_processes must be a positive integer, got {processes!r}")
    kind = data.get("distributed_type", "NO")
    stage = 0
    if kind == "DEEPSPEED":
        stage = int((data.get("deepspeed_config") or {}).get("zero_stage", 0))
    elif kind == "FSDP":
        stage = 3
    return Launch(processes, stage, str(path))


def plan_run(config: GRPOTrainConfig, accelerate_config: Path | None = None) -> TrainPlan:
    """Resolve `config` as `collab train` would, without loading a weight, for the launch
    of `accelerate_config` (see `launch_of`)."""
    from collabrl.train.grpo_config import grpo_args, rollout_protocol

    config.check()
    launch = launch_of(accelerate_config)
    args = grpo_args(config, Path(config.out or "runs/dry-run"))  # TRL's checks, one line
    plan = TrainPlan()
    _run_section(plan, config, launch)
    _trl_section(plan, args)
    _batch_section(plan, config, args, launch.processes)
    _placement_section(plan, config, rollout_protocol(config), args)
    _memory_section(plan, config, args, launch)
    return plan


def _run_section(plan: TrainPlan, config: GRPOTrainConfig, launch: Launch) -> None:
    section = "run"
    plan.add(section, "method", config.method)
    plan.add(section, "policy", config.model)
    plan.add(
        section, "data", config.data + ("" if config.limit is None else f" (first {config.limit})")
    )
    plan.add(section, "steps", config.steps)
    plan.add(section, "processes", f"{launch.processes} ({launch.source})")
    plan.add(section, "ZeRO stage", launch.zero_stage or "none")
    _data_rows(plan, config)


def _data_rows(plan: TrainPlan, config: GRPOTrainConfig) -> None:
    """The training and held-out sets, opened as the run opens them (a missing column or
    a bad row is refused here too); one not on this machine is a warning."""
    from collabrl.data.benchmarks import Fields, load_benchmark
    from collabrl.train.grpo_config import held_out_config

    sets = [("problems", config.data, Fields.of(config), config.limit)]
    if config.eval_data is not None:
        held_out = held_out_config(config, Path("checks-only"), config.model, None)
        sets.append(("held-out", config.eval_data, Fields.of(held_out), config.eval_limit))
    for label, data, fields, limit in sets:
        if _data_known(data):
            count = len(load_benchmark(data, fields, limit).items)
            plan.add("run", label, count if data == config.data else f"{count} ({data})")
        else:
            plan.warnings.append(f"{label} '{data}' is not on this machine")


def _data_known(data: str) -> bool:
    from collabrl.data import benchmarks

    return data in benchmarks.registry() or Path(data).exists()


# The TRL settings a paper-scale run depends on, as the trainer reads them.
TRL_KEYS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "beta",
    "loss_type",
    "epsilon",
    "epsilon_high",
    "num_iterations",
    "temperature",
    "max_completion_length",
    "bf16",
    "use_vllm",
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_cap",
    "seed",
)


def _trl_section(plan: TrainPlan, args: Any) -> None:
    section = "TRL (effective)"
    # TRL reads gradient_checkpointing; transformers >= 5.20 mirrors its new name into it.
    plan.add(section, "gradient checkpointing", args.gradient_checkpointing)
    for key in TRL_KEYS:
        if hasattr(args, key):
            value = getattr(args, key)
            plan.add(section, key, getattr(value, "value", value))  # enums by their value
    if not args.bf16 and not _cuda():
        plan.warnings.append("bf16 is off because this machine has no CUDA GPU; on one it is on")


def _batch_section(plan: TrainPlan, config: GRPOTrainConfig, args: Any, world: int) -> None:
    section = "batch (completions)"
    micro = args.per_device_train_batch_size
    accumulation = args.gradient_accumulation_steps
    per_generation = args.steps_per_generation or accumulation
    rollout = micro * per_generation
    plan.add(section, "G (samples per problem)", config.sampling.n)
    plan.add(section, "micro-batch per process", micro)
    plan.add(section, "gradient accumulation", accumulation)
    plan.add(section, "rollout per process", f"{rollout} = {rollout // config.sampling.n} problems")
    plan.add(
        section,
        "rollout, all processes",
        f"{rollout * world} = {rollout * world // config.sampling.n} problems",
    )
    plan.add(
        section, "optimizer update", f"{micro * accumulation * world} completions, all processes"
    )
    updates = per_generation // accumulation
    plan.add(section, "updates per rollout", f"{updates} × num_iterations {args.num_iterations}")
    if config.method == "eapo" and updates * args.num_iterations == 1:
        plan.warnings.append(
            "one optimizer update per rollout: the PPO ratio is always 1 and DAPO's clip "
            "never acts (set trl.steps_per_generation above trl.gradient_accumulation_steps)"
        )


def _placement_section(
    plan: TrainPlan, config: GRPOTrainConfig, protocol: ProtocolConfig, args: Any
) -> None:
    section = "who runs where"
    if args.use_vllm and args.vllm_mode == "colocate":
        rollouts = (
            f"TRL's vLLM in every process, {args.vllm_gpu_memory_utilization:.0%} of its GPU, "
            f"tensor parallel {args.vllm_tensor_parallel_size}"
        )
    elif args.use_vllm:
        host = args.vllm_server_base_url or f"{args.vllm_server_host}:{args.vllm_server_port}"
        rollouts = f"trl vllm-serve at {host} (not contacted)"
    else:
        rollouts = "the trained model, in every process (transformers)"
    plan.add(section, "policy (trained)", "accelerate: one copy per process")
    plan.add(section, "policy rollouts", rollouts)
    plan.add(
        section,
        "chat template options",
        protocol.chat_template_kwargs or config.engine.chat_template_kwargs or "none",
    )
    for role, ref in _collaborators(protocol):
        plan.add(section, role, _where(ref, config, plan))
    if "planner" in registry.get(protocol.name).collaborators and protocol.planner:
        if not _on_this_machine(protocol.planner):
            plan.warnings.append(f"model '{protocol.planner}' is not on this machine")
        where = "trained beside the policy in every process (float32, DDP)"
        plan.add(section, "planner", f"{protocol.planner}: {where}")


def _collaborators(protocol: ProtocolConfig) -> list[tuple[str, str]]:
    """(role, model reference or URL) of every teacher or expert beside the policy, as
    the protocol's spec names its collaborators (the planner has its own line)."""
    roles = registry.get(protocol.name).collaborators
    found: list[tuple[str, str]] = []
    if "teacher" in roles and protocol.teacher:
        found.append(("teacher", protocol.teacher))
    if "experts" in roles:
        found += [(f"expert {i}", ref) for i, ref in enumerate(protocol.experts, start=1)]
    return found


def _where(ref: str, config: GRPOTrainConfig, plan: TrainPlan) -> str:
    from collabrl.devices import resolve_device
    from collabrl.engines import resolve_kind
    from collabrl.engines.reference import stand_in_accuracy

    accuracy = stand_in_accuracy(ref)
    if accuracy is not None:
        return f"the reference stand-in (the gold answer on {accuracy:.0%} of problems, no model)"
    if is_url(ref):
        return f"server at {ref} (not contacted)"
    if not _on_this_machine(ref):
        plan.warnings.append(f"model '{ref}' is not on this machine")
    kind = resolve_kind(ref, config.engine)
    return f"{ref}: {kind} engine on {resolve_device(config.engine.device)}, in every process"


def _on_this_machine(ref: str) -> bool:
    from collabrl.models import resolve_model

    try:
        resolve_model(ref)
    except UserError:
        return False
    return True


def _memory_section(plan: TrainPlan, config: GRPOTrainConfig, args: Any, launch: Launch) -> None:
    section = "memory per device (estimate)"
    shape = model_shape(config.model)
    if shape is None:
        plan.add(section, "policy", "unknown size: no config.json here and no size in its name")
        return
    if shape.source != "config.json":
        plan.warnings.append(
            f"policy '{config.model}' is not on this machine: its size is read from {shape.source}"
        )
    colocated = args.use_vllm and args.vllm_mode == "colocate"
    sequence = PROMPT_TOKENS + config.sampling.max_tokens
    memory = estimate_memory(
        shape,
        micro_batch=args.per_device_train_batch_size,
        sequence=sequence,
        checkpointing=args.gradient_checkpointing,
        world_size=launch.processes,
        zero_stage=launch.zero_stage,
        vllm_fraction=args.vllm_gpu_memory_utilization if colocated else None,
    )
    plan.add(section, "parameters", f"{shape.parameters / 1e9:.2f} B (from {shape.source})")
    plan.add(
        section,
        "weights + gradients + AdamW",
        f"{memory.weights + memory.gradients + memory.optimizer:.1f} GiB",
    )
    for name, value in (("activations", memory.activations), ("logits", memory.logits)):
        shown = "unknown (no config.json)" if value is None else f"{value:.1f} GiB"
        plan.add(section, f"{name} ({args.per_device_train_batch_size} × {sequence} tokens)", shown)
    memory = _with_planner(plan, config, memory)
    plan.add(section, "training total", f"{memory.training:.1f} GiB")
    if memory.vllm_fraction is not None:
        plan.add(section, "colocated vLLM", f"+ {memory.vllm_fraction:.0%} of the device")
    _fit(plan, memory)


def _with_planner(
    plan: TrainPlan, config: GRPOTrainConfig, memory: MemoryEstimate
) -> MemoryEstimate:
    """rsim also trains its planner's backbone, in every process, under DDP."""
    planner = config.protocol.planner
    if config.method != "rsim" or not planner:
        return memory
    shape = model_shape(planner)
    if shape is None:
        plan.add("memory per device (estimate)", "planner", "unknown size")
        return memory
    state = shape.parameters * (WEIGHT_BYTES + GRAD_BYTES + ADAM_BYTES) / GIB
    plan.add(
        "memory per device (estimate)", "planner weights + gradients + AdamW", f"{state:.1f} GiB"
    )
    return dataclasses.replace(memory, planner=state)


def _fit(plan: TrainPlan, memory: MemoryEstimate) -> None:
    """Compare with this machine's GPU, when it has one."""
    if not _cuda():
        return
    import torch

    total = torch.cuda.get_device_properties(0).total_memory / GIB
    free = total * (1 - (memory.vllm_fraction or 0.0))
    plan.add(
        "memory per device (estimate)", "this GPU", f"{total:.0f} GiB, {free:.0f} GiB for training"
    )
    if memory.training > free:
        plan.warnings.append(
            f"the estimate ({memory.training:.0f} GiB) exceeds what this GPU leaves for "
            f"training ({free:.0f} GiB)"
        )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
