"""The checkpoints a run resumes from: which one, and whether transformers could load it."""

from __future__ import annotations

import zipfile
from pathlib import Path

from collabrl.errors import UserError


def last_checkpoint(checkpoints: Path, resume: bool) -> str | None:
    """The checkpoint to resume from; a fresh run must not overwrite another's checkpoints."""
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    if resume and last is None:
        raise UserError(f"no checkpoint to resume in {checkpoints}", "run without --resume")
    if not resume and last is not None:
        raise UserError(
            f"{checkpoints.parent} already holds checkpoints of a run",
            "pass --resume to continue it, or use a new --out folder",
        )
    if last is not None:
        check_checkpoint(Path(last))
    return last


def check_checkpoint(checkpoint: Path) -> None:
    """Refuse a checkpoint transformers could not load (a kill or a full disk while it
    was saved, a file overwritten), before any model loads, offering the sound one
    before it: transformers would fail with a traceback once the model and data are
    loaded. The resume picks the last checkpoint, so the user moves the broken one."""
    problem = checkpoint_problem(checkpoint)
    if problem is None:
        return
    step = checkpoint_step(str(checkpoint))
    earlier = sorted(
        (c for c in checkpoint.parent.glob("checkpoint-*") if c.is_dir() and c != checkpoint),
        key=lambda c: checkpoint_step(str(c)),
    )
    sound = [c for c in earlier if checkpoint_step(str(c)) < step and not checkpoint_problem(c)]
    fix = (
        f"move or delete {checkpoint} to resume from {sound[-1].name}, the one before it"
        if sound
        else f"move or delete {checkpoint} and run without --resume, or use a new --out folder"
    )
    raise UserError(f"checkpoint {checkpoint} is broken: {problem}", fix)


def checkpoint_problem(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint folder, or None. Cheap checks, no tensor is read:
    the trainer state parses, each safetensors header matches its file's size, and each
    torch file (optimizer, scheduler, RNG states) has zip's end record, which a cut or
    overwritten file lacks."""
    from collabrl.userfiles import read_json

    try:
        state = read_json(checkpoint / TRAINER_STATE, "trainer state")
    except UserError as err:
        return err.problem
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return f"{TRAINER_STATE} holds no global_step"
    for path in sorted(checkpoint.iterdir()):
        if path.suffix == ".safetensors" and not _whole_safetensors(path):
            return f"{path.name} is cut short or is not safetensors"
        if path.suffix in TORCH_SUFFIXES and not zipfile.is_zipfile(path):
            return f"{path.name} is cut short or is not a torch file"
    return None


TRAINER_STATE = "trainer_state.json"
# What `torch.save` writes a checkpoint's optimizer, scheduler and RNG states to: zip files.
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def _whole_safetensors(path: Path) -> bool:
    """Whether the file's header parses and its tensors end where the file does (the
    library checks both when it opens a file, mapping it, not reading it)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt"):
            return True
    except Exception:  # safetensors raises its own error types, and OSError
        return False


def checkpoint_step(checkpoint: str) -> int:
    """TRL names a checkpoint after its optimizer step: checkpoint-<step>."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1])
