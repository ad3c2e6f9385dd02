"""`collab train METHOD --dry-run`: a run resolved without loading a weight, as rows.

What a researcher checks before taking a config to a cluster: the settings as TRL will
read them (not as the YAML spells them), the batch and group sizes per process and
overall, every collaborator and where it runs, and a memory estimate per device. The
run is resolved as `collab train` resolves it (`train/resolve.py`), so an inconsistent
config is refused with one line here as it would be at launch. Nothing is contacted
and no weight is read. The figures are `train/memory.py`'s arithmetic (the policy's
memory term by term, a colocated vLLM's KV cache, what `eval_steps` holds: a periodic
evaluation that cannot fit is refused here, the checkpoints' disk); this module lays
them out for the launch, on this machine's GPU or an 80 GB one where it has none. The
method adds its own rows through its spec (EAPO's experts and schedules, rSIM's λ
stages and its planner's memory).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from collabrl.engines import is_url
from collabrl.errors import UserError
from collabrl.protocols import registry
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
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.resolve import ResolvedRun


@dataclass
class TrainPlan:
    """Titled sections of (setting, value) rows, and the warnings to show under them."""

    sections: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def add(self, section: str, key: str, value: object) -> None:
        self.sections.setdefault(section, []).append((key, str(value)))


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


def plan_run(
    run: ResolvedRun,
    accelerate_config: Path | None = None,
    num_processes: int | None = None,
) -> TrainPlan:
    """Lay out `run` as `collab train` would run it, without loading a weight, for the
    launch of `accelerate_config` (see `launch_of`; `num_processes` as `accelerate launch
    --num_processes` overrides the file's)."""
    from collabrl.train.grpo_args import check_run, grpo_args

    config = run.config
    check_run(config)
    launch = launch_of(accelerate_config)
    if num_processes is not None:
        launch = dataclasses.replace(launch, processes=num_processes, source="--num-processes")
    plan = TrainPlan(warnings=run_warnings(run))
    data = _training_data(plan, run)
    longest = data.longest_prompt if data is not None else None
    args = grpo_args(config, Path(config.out or "runs/dry-run"), longest)  # TRL's checks
    _run_section(plan, run, launch, data, args)
    _trl_section(plan, config, args)
    _batch_section(plan, config, args, launch.processes)
    steps = _step_count(config, data, args, launch.processes)
    run.method.plan_rows(plan, config, args, steps)  # the method's own (eapo's schedules)
    _placement_section(plan, config, run.protocol, args, launch)
    _memory_section(plan, run, args, launch)
    return plan


def run_warnings(run: ResolvedRun) -> list[str]:
    """What the run's settings make of its numbers (`eval/cautions.py`): test-split
    problems, a stand-in collaborator, a call protocol on an un-warmed policy. The dry run
    lists them and `collab train` prints them before it starts, on the main process."""
    from collabrl.eval import cautions

    config, protocol = run.config, run.protocol
    found = [
        cautions.split_warning(config.data),
        cautions.stand_in_warning(protocol),
        cautions.unwarmed_call_warning(config.model, protocol),
    ]
    return [warning for warning in found if warning is not None]


@dataclass(frozen=True)
class TrainingData:
    """What a dry run reads of the training set, when it is on this machine."""

    total: int  # the problems of the data (`limit` applied)
    problems: int  # those the run trains on: the ones max_prompt_tokens keeps
    longest_prompt: int | None = None  # in policy tokens; None: not counted here


def _training_data(plan: TrainPlan, run: ResolvedRun) -> TrainingData | None:
    """The training set opened as the run opens it (a missing column or a bad row is
    refused here too), its prompts rendered as the rollout renders them where their
    length matters (max_prompt_tokens, a colocated vLLM) and the tokenizer is here."""
    from collabrl.data.benchmarks import Fields, load_benchmark
    from collabrl.train.grpo_args import sizes_vllm
    from collabrl.train.prompt_length import fit_prompts, prompt_lengths

    config = run.config
    if not _data_known(config.data):
        plan.warnings.append(f"problems '{config.data}' is not on this machine")
        return None
    bench = load_benchmark(config.data, Fields.of(config), config.limit)
    total = len(bench.items)
    if config.max_prompt_tokens is None and not sizes_vllm(config.trl):
        return TrainingData(total, total)
    tokenizer = config.protocol.tokenizer or config.model
    if not _on_this_machine(tokenizer):
        plan.warnings.append(
            f"the tokenizer of '{tokenizer}' is not on this machine: prompt lengths are "
            "counted when the run starts"
        )
        return TrainingData(total, total)
    if config.max_prompt_tokens is None:
        return TrainingData(total, total, max(prompt_lengths(run, bench)))
    fitted = fit_prompts(run, bench)  # none fitting is refused, as at the start
    return TrainingData(total, len(fitted.bench.items), fitted.longest)


def _run_section(
    plan: TrainPlan,
    run: ResolvedRun,
    launch: Launch,
    data: TrainingData | None,
    args: Any,
) -> None:
    section, config = "run", run.config
    plan.add(section, "method", config.method)
    plan.add(section, "protocol", config.protocol.name)
    plan.add(section, "policy", config.model)
    plan.add(
        section, "data", config.data + ("" if config.limit is None else f" (first {config.limit})")
    )
    plan.add(section, "steps", _steps(config, data, args, launch.processes))
    plan.add(section, "processes", f"{launch.processes} ({launch.source})")
    plan.add(section, "ZeRO stage", launch.zero_stage or "none")
    _data_rows(plan, run, data)


def _steps(config: GRPOTrainConfig, data: TrainingData | None, args: Any, world: int) -> str:
    """The optimizer steps, "0: one epoch" counted as the run will count it."""
    steps = _step_count(config, data, args, world)
    if config.steps:
        return str(config.steps)
    if data is None:
        return "one epoch (counted when the run starts: the data is not on this machine)"
    processes = f"{world} processes" if world > 1 else "1 process"
    return f"{steps} (one epoch of {data.problems} problems on {processes})"


def _step_count(
    config: GRPOTrainConfig, data: TrainingData | None, args: Any, world: int
) -> int | None:
    """The run's optimizer steps; None for one epoch of data not on this machine."""
    from collabrl.train.grpo_args import epoch_steps

    if config.steps:
        return config.steps
    if data is None:
        return None
    return epoch_steps(data.problems, args, world, config.sampling.n)


def _data_rows(plan: TrainPlan, run: ResolvedRun, data: TrainingData | None) -> None:
    """The training set's counts and prompt limit, and the held-out set, opened as the
    run opens it; one not on this machine is a warning."""
    from collabrl.data.benchmarks import Fields, load_benchmark
    from collabrl.train.held_out import held_out_config

    config = run.config
    limit = config.max_prompt_tokens
    plan.add("run", "max prompt tokens", "none (no limit)" if limit is None else limit)
    if data is not None:
        kept = str(data.total)
        if limit is not None and data.longest_prompt is not None:
            kept = f"{data.problems} of {data.total} ({data.total - data.problems} dropped)"
        elif limit is not None:
            kept = f"{data.total} before max_prompt_tokens (it drops its share at start)"
        plan.add("run", "problems", kept)
        if data.longest_prompt is not None:
            plan.add("run", "longest prompt", f"{data.longest_prompt} tokens")
    if config.eval_data is not None:
        held_out = held_out_config(run, Path("checks-only"), config.model, None)
        if _data_known(config.eval_data):
            fields = Fields.of(held_out)
            count = len(load_benchmark(config.eval_data, fields, config.eval_limit).items)
            plan.add("run", "held-out", f"{count} ({config.eval_data})")
        else:
            plan.warnings.append(f"held-out '{config.eval_data}' is not on this machine")


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
    "delta",
    "num_iterations",
    "temperature",
    "top_p",
    "max_completion_length",
    "bf16",
    "use_vllm",
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    "vllm_tensor_parallel_size",
    "vllm_max_model_length",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_cap",  # clip_max's old name: shown by a TRL that lacks clip_max
    "seed",
)


def deprecated_trl_keys() -> frozenset[str]:
    """The GRPOConfig arguments the installed TRL marks deprecated (their help says so):
    the plan shows the name that replaced each, not both."""
    from trl import GRPOConfig

    return frozenset(
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if str(f.metadata.get("help", "")).lstrip().lower().startswith("deprecated")
    )


def _trl_section(plan: TrainPlan, config: GRPOTrainConfig, args: Any) -> None:
    from collabrl.train.grpo_args import sizes_vllm

    section = "TRL (effective)"
    # TRL reads gradient_checkpointing; transformers >= 5.20 mirrors its new name into it.
    plan.add(section, "gradient checkpointing", args.gradient_checkpointing)
    shown: dict[str, Any] = {}
    budget = config.sampling.max_tokens
    if sizes_vllm(config.trl) and args.vllm_max_model_length is None:
        # Sized at the start from the data, which is not on this machine.
        shown["vllm_max_model_length"] = f"the longest prompt + {budget} (counted at start)"
    if args.use_vllm and args.vllm_mode == "server":
        prompt = config.max_prompt_tokens
        longest = "the longest prompt" if prompt is None else str(prompt)
        shown["vllm_max_model_length"] = f"trl vllm-serve --max-model-len ({longest} + {budget})"
    deprecated = deprecated_trl_keys()
    for key in TRL_KEYS:
        if hasattr(args, key) and key not in deprecated:
            value = shown.get(key, getattr(args, key))
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


def _placement_section(
    plan: TrainPlan, config: GRPOTrainConfig, protocol: ProtocolConfig, args: Any, launch: Launch
) -> None:
    section = "who runs where"
    plan.add(section, "trainer GPUs", _trainer_gpus(plan, launch.processes))
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
    for collaborator in registry.get(protocol.name).collaborators:
        if collaborator.served and not collaborator.serves(protocol):
            # A model the protocol runs in-process (rSIM's planner): trained beside the policy.
            for ref in registry.collaborator_refs(protocol, collaborator):
                if not _on_this_machine(ref):
                    plan.warnings.append(f"model '{ref}' is not on this machine")
                where = "trained beside the policy in every process (float32, DDP)"
                plan.add(section, collaborator.name, f"{ref}: {where}")
    _shared_gpus(plan, _local_servers(protocol, args), launch.processes)


# Host names that put a server on the node the trainer runs on.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "0.0.0.0", "::1"})


def _visible_gpus() -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES lists; None when it is unset (every GPU)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if visible is None else [g.strip() for g in visible.split(",") if g.strip()]


def _trainer_gpus(plan: TrainPlan, processes: int) -> str:
    """Where accelerate puts the processes: process i on the i-th visible GPU."""
    visible = _visible_gpus()
    if visible is None:
        return f"CUDA_VISIBLE_DEVICES unset: a node's process k on its GPU k ({_gpus(processes)})"
    if processes > len(visible):
        plan.warnings.append(
            f"{processes} processes but CUDA_VISIBLE_DEVICES lists {len(visible)} GPUs: "
            "processes share GPUs (set --num_processes to the GPUs listed)"
        )
    return f"CUDA_VISIBLE_DEVICES={','.join(visible)}: {processes} processes"


def _gpus(processes: int) -> str:
    return "GPU 0" if processes == 1 else f"GPUs 0–{processes - 1}"


def _local_servers(protocol: ProtocolConfig, args: Any) -> list[tuple[str, str]]:
    """(role, URL) of the servers the run calls on this node: teachers and experts at a
    local address, and TRL's policy server in vllm_mode server."""
    servers = [(role, ref) for role, ref in _collaborators(protocol) if is_url(ref)]
    if args.use_vllm and args.vllm_mode == "server":
        host = f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        servers.append(("trl vllm-serve", args.vllm_server_base_url or host))
    this_node = socket.gethostname()
    return [(r, u) for r, u in servers if urlparse(u).hostname in {*LOCAL_HOSTS, this_node}]


def _shared_gpus(plan: TrainPlan, servers: list[tuple[str, str]], processes: int) -> None:
    """Warn when the trainer and a server on this node are likely on the same GPUs. The
    heuristic: with CUDA_VISIBLE_DEVICES unset, the trainer's processes take GPUs 0 to
    P-1 (all of a P-GPU node), and a server started on this node without it sits on GPU
    0; where it is set, the trainer keeps to the GPUs it lists and the servers are
    trusted to be elsewhere (their own CUDA_VISIBLE_DEVICES is not visible from here)."""
    if _visible_gpus() is not None:
        return
    for role, url in servers:
        plan.warnings.append(
            f"the trainer and the {role} at {url} may share GPUs: CUDA_VISIBLE_DEVICES is "
            f"unset, so the trainer's {processes} processes take {_gpus(processes)} (a "
            f"{processes}-GPU node: all of them), and a server on this node ({url}) is on "
            "GPUs of the same node; launch the trainer with CUDA_VISIBLE_DEVICES listing "
            "only GPUs the server does not use (and run this dry run with it)"
        )


def _collaborators(protocol: ProtocolConfig) -> list[tuple[str, str]]:
    """(role, model reference or URL) of every model the protocol's spec serves beside
    the policy (a teacher, "experts 1–3 of K = 3", a prompted planner)."""
    found: list[tuple[str, str]] = []
    for collaborator in registry.get(protocol.name).collaborators:
        if collaborator.serves(protocol):
            refs = registry.collaborator_refs(protocol, collaborator)
            if collaborator.many:
                found += _panel(collaborator.name, refs, protocol.consult.num_experts)
            else:
                found += [(collaborator.name, ref) for ref in refs]
    return found


def _panel(name: str, refs: list[str], experts: int) -> list[tuple[str, str]]:
    """A panel of K experts over its endpoints, as the expert pool routes them (round
    robin: expert i to endpoint (i − 1) mod n): one row per endpoint, naming its experts."""
    from collabrl.engines.endpoints import endpoint_index

    rows = []
    for index, ref in enumerate(refs):
        ids = [i for i in range(1, experts + 1) if endpoint_index(i, experts, len(refs)) == index]
        served = _id_list(ids) if ids else "none"
        rows.append((f"{name} {served} of K = {experts}", ref))
    return rows


def _id_list(ids: list[int]) -> str:
    """`1–3` for a run of ids, `1, 3` otherwise."""
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}"
    return ", ".join(map(str, ids))


def _where(ref: str, config: GRPOTrainConfig, plan: TrainPlan) -> str:
    from collabrl.devices import resolve_device
    from collabrl.engines import resolve_kind
    from collabrl.engines.reference import stand_in_description

    stand_in = stand_in_description(ref)
    if stand_in is not None:
        return stand_in
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


def _memory_section(plan: TrainPlan, run: ResolvedRun, args: Any, launch: Launch) -> None:
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
    memory = terms(bf16=args.bf16, triton=_cuda())
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
    if not args.bf16 and not _cuda() and "bf16" not in config.trl:
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
    if not _cuda():
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


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
