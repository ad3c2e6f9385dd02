"""TRL's GRPOConfig of a `collab train grpo|relay|eapo|rsim` run, and the checks that
need the trainer side.

`GRPOTrainConfig` (`grpo_config.py`) is config only, as TRL's own config modules are;
what needs TRL or the trainer is here: `grpo_args` turns the run's config into TRL's
arguments, each value set in one place (the run's own fields set the TRL arguments the
rollout mirrors, `MIRRORED_TRL_KEYS`, and the `trl` block may not contradict them), and
`check_run` is what a run and its dry run refuse before any data or model loads.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from collabrl.errors import UserError
from collabrl.train.compat import checkpointing_args
from collabrl.train.grpo_config import MIRRORED_TRL_KEYS, GRPOTrainConfig
from collabrl.train.methods import registry as methods
from collabrl.train.rewards import load_reward_func
from collabrl.train.run import CHECKPOINTS, check_trl_keys, resumed_config, trl_args
from collabrl.train.trackers import trackers


def check_run(config: GRPOTrainConfig) -> None:
    """Refuse, before any data or model loads, a run that cannot start: the config's own
    checks, then what needs the trainer side: each of the user's reward functions loads,
    and TRL takes the `trl` block and the arguments built from it (a mistyped key, a
    group split across generations). `collab train` and its dry run both call it first."""
    from trl import GRPOConfig

    config.check()
    for spec in config.reward_funcs:
        load_reward_func(spec)
    # Checked under the names this transformers reads: either checkpointing name works.
    check_trl_keys(checkpointing_args(config.trl, default=False), GRPOConfig)
    check_colocated_tensor_parallel(config.trl)
    grpo_args(config, Path("checks-only"))  # what TRL refuses, e.g. a group split in two


# The learning-rate schedule of every GRPO method unless trl.lr_scheduler_type says
# otherwise (rSIM's paper config sets cosine).
LR_SCHEDULE = "constant"

# vLLM-sampled episodes are corrected per token, truncated at TRL's cap (TIS). TRL's
# default, a sequence-level mask, multiplies the token ratios of a whole episode: over
# thousands of policy tokens small sampler/trainer differences add up and push the
# longest episodes outside the bounds, which drops them whole (`train/importance.py`
# measures how many). The `trl` block overrides it.
IS_DEFAULTS = {"vllm_importance_sampling_mode": "token_truncate"}


def check_colocated_tensor_parallel(trl: dict[str, Any]) -> None:
    """Refuse a colocated vLLM split over several GPUs: TRL gathers the prompts of a
    tensor-parallel group before each generate, but the rollout calls each process's
    `vllm.LLM` directly with its own prompts, so the group's ranks would generate
    different batches and desynchronise or hang."""
    size = trl_value(trl, "vllm_tensor_parallel_size")
    if colocated_vllm(trl) and size > 1:
        raise UserError(
            f"trl.vllm_tensor_parallel_size {size} with the colocated vLLM is not supported "
            "(the rollout generates on each process's own vLLM)",
            f"serve the policy with `trl vllm-serve --model PATH --tensor-parallel-size {size}` "
            "and set trl.vllm_mode: server, or use trl.vllm_tensor_parallel_size: 1",
        )


def trl_value(trl: dict[str, Any], key: str) -> Any:
    """TRL's GRPOConfig argument `key` as the `trl` block sets it, else TRL's default."""
    from trl import GRPOConfig

    return trl.get(key, next(f.default for f in dataclasses.fields(GRPOConfig) if f.name == key))


def colocated_vllm(trl: dict[str, Any]) -> bool:
    """Whether the rollouts generate on a vLLM in every training process."""
    return bool(trl_value(trl, "use_vllm")) and trl_value(trl, "vllm_mode") == "colocate"


def sizes_vllm(trl: dict[str, Any]) -> bool:
    """Whether the run's prompt length sizes TRL's vLLM: a colocated one whose length
    the `trl` block leaves unset."""
    return colocated_vllm(trl) and "vllm_max_model_length" not in trl


def mirrored_value(config: GRPOTrainConfig, key: str) -> Any:
    """The value TRL's argument `key` takes from the run's field."""
    value: Any = config
    for part in MIRRORED_TRL_KEYS[key].split("."):
        value = getattr(value, part)
    # TRL turns top-k off with 0, the engines with -1.
    return max(value, 0) if key == "top_k" else value


def grpo_args(config: GRPOTrainConfig, out: Path, prompt_tokens: int | None = None) -> Any:
    """TRL's GRPOConfig for the run: CPU-safe defaults, then the `trl` block.
    The colocated vLLM is sized to max_prompt_tokens, else to `prompt_tokens`, the
    longest prompt of the data (`prompt_length.longest_prompt`)."""
    import torch
    from trl import GRPOConfig

    cpu = not torch.cuda.is_available()
    settings: dict[str, Any] = {
        "output_dir": str(out / CHECKPOINTS),
        **{key: mirrored_value(config, key) for key in MIRRORED_TRL_KEYS},
        "per_device_train_batch_size": config.prompts_per_step * config.sampling.n,
        # The papers' trainers hold the rate (EasyR1 and verl: constant after any warm-up;
        # RelayLLM App. E, EAPO Table 4); TRL's default decays it linearly to 0, so a
        # 2-step run would log 1e-6, then 5e-7. The trl block may set another.
        "lr_scheduler_type": LR_SCHEDULE,
        "logging_steps": 1,
        "disable_tqdm": True,  # the command draws its own bar
        "save_steps": config.save_steps,
        "save_strategy": "steps",
        "report_to": trackers(config.report_to),
        # Truncation is the Episode's to say (a teacher's last token is not an EOS).
        "mask_truncated_completions": False,
        # On a CPU, bf16 makes a step ~10x slower.
        "bf16": not cpu and torch.cuda.is_bf16_supported(),
        "use_cpu": cpu,
        **IS_DEFAULTS,
        **methods.get(config.method).trl,  # the method's own (eapo: DAPO's clip)
        **vllm_length(config, config.max_prompt_tokens or prompt_tokens),
        # Last: the block's checkpointing switch, under either name, decides (off unless
        # it says so; on a CPU it only slows the step).
        **checkpointing_args(config.trl, default=False),
    }
    return trl_args(GRPOConfig, settings)


def policy_dtype(args: Any) -> str:
    """The dtype the trainer holds the policy in, so the dtype to load it in. Under
    DeepSpeed with TRL's bf16 (fp16), DeepSpeed casts the model to it and keeps the fp32
    master weights in its optimizer, built from the cast weights: loading in bf16 gives
    the same training and half the host memory per process (a 7B policy: 15 GB, not
    30). Otherwise the model holds the fp32 master weights itself (autocast computes in
    bf16; AdamW stepping bf16 weights would lose most updates at lr 1e-6)."""
    if getattr(args, "deepspeed_plugin", None) is None:
        return "float32"
    if args.bf16:
        return "bfloat16"
    return "float16" if args.fp16 else "float32"


def vllm_length(config: GRPOTrainConfig, prompt_tokens: int | None) -> dict[str, int]:
    """A colocated vLLM sized to the longest sequence a rollout can write: the prompt and
    the episode's budget (every author's tokens). Left to TRL, the length is the model's
    (max_position_embeddings: 131,072 for R1-Distill-7B), and vLLM reserves that context
    in the KV cache it carves out of vllm_gpu_memory_utilization; the `trl` block may set
    it."""
    if prompt_tokens is None or not sizes_vllm(config.trl):
        return {}
    return {"vllm_max_model_length": prompt_tokens + config.sampling.max_tokens}


def epoch_steps(problems: int, args: Any, world: int, group: int) -> int:
    """Optimizer steps of one pass over `problems` with TRL's arguments `args` on `world`
    processes: every problem's `group` samples trained once per TRL num_iterations (TRL
    trains each generation that many times)."""
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    return math.ceil(problems * group / per_step) * args.num_iterations


def pin_steps(config: GRPOTrainConfig, out: Path, problems: int, world: int) -> GRPOTrainConfig:
    """`config` with steps 0 ("one epoch") as a number: one pass over the `problems`
    the run trains on, on `world` processes; a resumed run keeps the number its folder's
    config.yaml holds (as `schedules.pin_horizons` keeps the horizons)."""
    if config.steps:
        return config
    before = resumed_config(config, out)
    if before is not None and before.steps:
        return dataclasses.replace(config, steps=before.steps)
    args = grpo_args(config, Path("checks-only"))
    return dataclasses.replace(config, steps=epoch_steps(problems, args, world, config.sampling.n))
