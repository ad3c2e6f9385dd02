"""`collab train sft`: the warm-up, supervised fine-tuning on a builder's rows. It rolls
nothing out: its command, config and trainer are its own (`train/sft.py`)."""

from __future__ import annotations

from collabrl.train.methods.spec import MethodSpec

SPEC: MethodSpec = MethodSpec(
    name="sft",
    help="RelayLLM §3.1 warm-up: supervised fine-tuning on prompt/completion rows (from "
    "`collab build-warmup`), the loss on the completion only. OUT/final is the model.",
    config="collabrl.train.sft:SFTTrainConfig",
    card="supervised fine-tuning on prompt-completion rows (RelayLLM's warm-up, §3.1)",
    tags=("sft",),
    rows="rows",
)
