"""Where this process stands in a launch: its rank and group, and how to step outside
them (a child process alone, a model loaded outside DeepSpeed ZeRO-3)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# Read from the launcher's environment, not from accelerate's `PartialState()`: that is a
# singleton whose first construction sets up the process group, so building it before
# TRL's arguments do would fix the group's timeout at accelerate's default and drop
# `trl.ddp_timeout` (transformers passes it only to the first construction).


def num_processes() -> int:
    """The processes of this launch (1 without `accelerate launch`)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Under `accelerate launch`, whether this is the process that evaluates and prints."""
    return os.environ.get("RANK", "0") == "0"


# What joins a process to its launch: torch's elastic agent (under `accelerate launch`)
# sets these, accelerate its ACCELERATE_* and FSDP_* settings (ACCELERATE_USE_DEEPSPEED
# among them), TRL's colocated vLLM rewrites RANK and WORLD_SIZE. A process started
# without them runs alone.
LAUNCH_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
LAUNCH_PREFIXES = ("ACCELERATE_", "FSDP_", "TORCHELASTIC_")


def solo_environment() -> dict[str, str]:
    """This process's environment less what joins it to its launch: a child started
    with it is a single process (engines and `from_pretrained` see no group to join)."""
    return {
        name: value
        for name, value in os.environ.items()
        if name not in LAUNCH_VARIABLES and not name.startswith(LAUNCH_PREFIXES)
    }


@contextmanager
def outside_zero3() -> Iterator[None]:
    """Load models on this process alone during a DeepSpeed ZeRO-3 launch. accelerate
    registers its DeepSpeed config with transformers for the whole process, and while it
    is registered every `from_pretrained` (PEFT's too) builds the model inside
    `deepspeed.zero.Init`, which partitions it with collectives every process must join:
    a process loading alone (the main one, after training) waits in them for ever. The
    config is unregistered for the block and registered again after it, for the trainer
    that still holds it. Without DeepSpeed nothing is registered, and nothing changes."""
    from transformers.integrations import deepspeed as hf_deepspeed

    # transformers keeps a weak reference only; its object, to register again after.
    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    registered = ref() if ref is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if registered is not None:
            hf_deepspeed.set_hf_deepspeed_config(registered)
