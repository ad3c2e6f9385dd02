"""A shipped paper config in miniature: the same run structure on a tiny model.

`miniature(path, model)` reads a paper config from configs/train/ and keeps what makes
its run's structure (the method, reward, β and so the reference model, LoRA, the loss
type and clip, num_iterations, checkpointing, the schedules, the chat-template options)
while it overrides what only sets its scale: the model (a tiny one), the data, the
group G, the token lengths, the number of steps, and the collaborators (the `reference`
stand-in for a teacher or experts, the tiny model for a planner). Batches shrink by one
rule that keeps their shape: micro-batch and accumulation shrink, but a generation is
still trained in the same number of optimizer updates, a group still spans micro-batches
(or fills them) as it does at scale, and token budgets keep their ratio to the episode
budget (EAPO's K expert answers against its episode is such an arithmetic). Built from
the file, so a change to a shipped config changes its miniature.

Not kept, because a CPU cannot run it: vLLM (the rollouts go through transformers) and
DeepSpeed (the miniature runs under configs/accelerate/cpu-2proc.yaml, two gloo processes).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

from collabrl.cli.options import load_config
from collabrl.config import read_yaml
from collabrl.protocols.consult_config import turn_tokens
from collabrl.train.methods import registry as methods

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# Every config in configs/train/ that is not a CPU demo stands for a paper-scale run.
PAPER_CONFIGS = sorted(p for p in (CONFIGS / "train").glob("*.yaml") if "-cpu-" not in p.name)

GROUP = 2  # G in miniature: the smallest group GRPO normalises over
MAX_TOKENS = 32  # the episode budget in miniature; other token budgets keep their ratio
SFT_MAX_LENGTH = 256  # a warm-up row (prompt and completion) in miniature
DATA = "arith_train"
HELD_OUT = {"eval_data": "arith", "eval_limit": 2}
# Methods whose authors evaluate during training: RelayLLM's EasyR1 config validates
# every step (trainer.val_freq 1). EAPO and rSIM report the start and the end.
EVALUATES_DURING_TRAINING = {"relay"}

# The rollout protocol's token budget beside the episode's, scaled by MAX_TOKENS /
# sampling.max_tokens: an expert's answer, a reasoner's step, a teacher's call.
TOKEN_KEYS = {
    "consult": "expert_max_tokens",
    "strategy": "step_max_tokens",
    "relay": "max_call_tokens",
}


def command_of(path: Path) -> str:
    """The `collab` command a train config is for (train-sft, train-relay, ...)."""
    if path.name.startswith("sft-"):
        return "train-sft"
    return f"train-{read_yaml(path)['method']}"


def miniature(path: Path, model: Path) -> dict[str, Any]:
    """The miniature of the shipped config at `path`, as a config mapping for the same
    command, on the local `model` (a tiny Hugging Face folder)."""
    if command_of(path) == "train-sft":
        return _sft_miniature(path, model)
    return _grpo_miniature(path, model)


def _grpo_miniature(path: Path, model: Path) -> dict[str, Any]:
    shipped = read_yaml(path)
    resolved = load_config(command_of(path), path, {}, [])
    mini = copy.deepcopy(shipped)
    trl = mini.setdefault("trl", {})
    batch = miniature_batch(resolved)
    trl.update(
        per_device_train_batch_size=batch["micro"],
        gradient_accumulation_steps=batch["accumulation"],
        steps_per_generation=batch["per_generation"],
        use_vllm=False,  # no vLLM on a CPU: the trained model generates (vllm_* unread)
    )
    updates = batch["per_generation"] // batch["accumulation"]
    mini.update(
        model=str(model),
        data=DATA,
        limit=16,
        prompts_per_step=batch["micro"] * batch["accumulation"] // GROUP,
        steps=2 * updates,  # two generations: the second samples from updated weights
        save_steps=updates,  # a checkpoint at the end of each generation
        sampling={**shipped.get("sampling", {}), "n": GROUP, "max_tokens": MAX_TOKENS},
    )
    block = methods.get(resolved.method).protocol
    if block in TOKEN_KEYS:
        key = TOKEN_KEYS[block]
        value = getattr(getattr(resolved.protocol, block), key)
        scaled = max(1, math.ceil(value * MAX_TOKENS / resolved.sampling.max_tokens))
        mini.setdefault("protocol", {}).setdefault(block, {})[key] = scaled
    if block == "consult":
        # A turn's calls and answer take fixed tokens that do not shrink: the episode
        # holds one full turn of the scaled answers, and MAX_TOKENS of the policy's own.
        consult = dataclasses.replace(resolved.protocol.consult, **mini["protocol"]["consult"])
        mini["sampling"]["max_tokens"] = MAX_TOKENS + turn_tokens(consult)
    _stand_in_collaborators(mini.setdefault("protocol", {}), model)
    mini.update(HELD_OUT)
    if resolved.method in EVALUATES_DURING_TRAINING or resolved.eval_steps is not None:
        mini["eval_steps"] = 1
    return mini


def miniature_batch(resolved: Any) -> dict[str, int]:
    """Micro-batch, accumulation and steps per generation in miniature: a group of GROUP
    samples spans micro-batches where G spans them at scale (else a micro-batch holds
    whole groups), accumulation is 2 where there is some, and a generation is trained in
    the same number of optimizer updates."""
    trl = resolved.trl
    group = resolved.sampling.n
    micro = trl.get("per_device_train_batch_size", resolved.prompts_per_step * group)
    accumulation = trl.get("gradient_accumulation_steps", 1)
    per_generation = trl.get("steps_per_generation", accumulation)
    if per_generation % accumulation:
        raise ValueError(f"steps_per_generation {per_generation} is not whole updates")
    mini_micro = max(1, micro * GROUP // group)
    mini_accumulation = 2 if accumulation > 1 else 1
    return {
        "micro": mini_micro,
        "accumulation": mini_accumulation,
        "per_generation": mini_accumulation * (per_generation // accumulation),
    }


def _stand_in_collaborators(protocol: dict[str, Any], model: Path) -> None:
    """A teacher or expert becomes the `reference` stand-in (no server, no model); a
    planner becomes the tiny model (rSIM trains it: it must be a real network)."""
    if "teacher" in protocol:
        protocol["teacher"] = "reference"
    if "experts" in protocol:
        protocol["experts"] = ["reference"] * len(protocol["experts"])
    if "planner" in protocol:
        protocol["planner"] = str(model)


def _sft_miniature(path: Path, model: Path) -> dict[str, Any]:
    """The warm-up in miniature: its accumulation, checkpointing and epochs on tiny rows
    (the data is the test's, given with --data)."""
    mini = copy.deepcopy(read_yaml(path))
    accumulation = mini.get("gradient_accumulation_steps", 1)
    mini.update(
        model=str(model),
        batch_size=min(mini.get("batch_size", 1), 2),
        gradient_accumulation_steps=2 if accumulation > 1 else 1,
        max_length=SFT_MAX_LENGTH,
        save_steps=1,
    )
    return mini
