"""The trained model as one Hugging Face folder (OUT/final): saved, merged, cast."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from collabrl.train.launch import outside_zero3

if TYPE_CHECKING:
    from transformers import Trainer

    from collabrl.train.lora import LoraSettings


def save_final(
    trainer: Trainer, final: Path, lora: LoraSettings | None = None, dtype: str = "auto"
) -> None:
    """Save the model and tokenizer as one Hugging Face folder that every engine loads
    (vLLM included); a LoRA adapter is merged into the base weights first unless
    `lora.merge` is off (then final/ is the adapter folder). Every process calls it: the
    trainer gathers sharded weights (DeepSpeed ZeRO-3, FSDP) and writes on the main
    process. `dtype` other than auto rewrites the weights in it (the trainer holds
    float32 master weights). Written aside and renamed into place, so a kill while
    saving leaves no half model in `final`.

    The merge reads the adapter back from disk, saved as the trainer saves any model,
    and merges it into the base weights loaded anew on the CPU: merging the live model
    would meet ZeRO-3's partitioned parameters (each process holds a slice; the merged
    weights would be empty or wrong). The same path serves every launch. The main
    process loads the base and the saved weights alone, `outside_zero3`."""
    tmp = final.with_name(final.name + ".tmp")
    saved_adapter = final.with_name(final.name + ".adapter")
    main = trainer.is_world_process_zero()
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.config.use_cache = True  # training turns the cache off; generation wants it
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(saved_adapter, ignore_errors=True)
    adapter = lora is not None and lora.enabled  # what the trainer trained
    merge = adapter and lora.merge
    # With the tokenizer (the trainer's processing_class).
    trainer.save_model(str(saved_adapter if merge else tmp))
    if main and merge:
        from collabrl.models import load_model

        # float32 on the CPU (load_model's defaults), as the trainer holds the weights;
        # loaded by this process alone, so outside ZeRO-3.
        with outside_zero3():
            load_model(str(saved_adapter)).save_pretrained(tmp)
        trainer.processing_class.save_pretrained(tmp)
        shutil.rmtree(saved_adapter)
    if main and dtype != "auto" and not (adapter and not lora.merge):  # an adapter stays
        cast_saved(tmp, dtype)
    if main:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)


def cast_saved(folder: Path, dtype: str) -> None:
    """Rewrite the weights saved in `folder` in `dtype` (read whole, then written anew);
    the main process does it alone, `outside_zero3`."""
    import torch
    from transformers import AutoModelForCausalLM

    cast = folder.with_name(folder.name + ".cast")
    shutil.rmtree(cast, ignore_errors=True)
    with outside_zero3():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
        model.save_pretrained(cast)
    del model
    for weights in [*folder.glob("*.safetensors"), *folder.glob("*.safetensors.index.json")]:
        weights.unlink()
    for path in cast.iterdir():
        os.replace(path, folder / path.name)
    cast.rmdir()
