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
stages and its planner's memory). Who runs where is `plan_placement.py`; memory, the
colocated vLLM, the periodic evaluation and the disk are `plan_memory.py`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl.errors import UserError
from collabrl.train.plan_memory import cuda, memory_section
from collabrl.train.plan_placement import on_this_machine, placement_section
from collabrl.train.plan_rows import Launch, TrainPlan

if TYPE_CHECKING:
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.resolve import ResolvedRun


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
    placement_section(plan, config, run.protocol, args, launch)
    memory_section(plan, run, args, launch)
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
    if not on_this_machine(tokenizer):
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
    if not args.bf16 and not cuda():
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
