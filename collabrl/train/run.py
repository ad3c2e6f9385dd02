"""The run folder every trainer writes, and the TRL callback that fills it.

    OUT/config.yaml      the resolved config, less what the method never reads, under a
                         header of how it ran (runs.prepare_folder)
    OUT/metrics.jsonl    every TRL log line, one per optimizer step
    OUT/train_curves.png the logged curves against the step
    OUT/checkpoints/     TRL's checkpoint-<step> folders: what --resume continues from
    OUT/final/           the trained model and tokenizer, a plain Hugging Face folder

A killed run continues with `--resume` from its last checkpoint; the metrics logged
after that checkpoint are dropped first, because the resumed run logs those steps again.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from collabrl import runs
from collabrl.errors import UserError

if TYPE_CHECKING:
    from transformers import Trainer, TrainerCallback

    from collabrl.train.lora import LoraSettings

T = TypeVar("T")

CHECKPOINTS = "checkpoints"
FINAL = "final"
METRICS = "metrics.jsonl"
ROLLOUTS = "rollouts.jsonl"  # a sample of every step's episodes (GRPO-based methods)
CURVES = "train_curves.png"
EVALUATION = "eval.json"  # the end-of-run evaluation's metrics: start, final, paired
# TRL arguments a collab run cannot honour, each as (why, what to do instead); the trl
# block is refused when it names one, before any model loads (the dry run and `config
# show` too). The run folder owns the checkpoints (elsewhere --resume would not find
# them); nothing is pushed to the Hub (TRL would push its checkpoints folder, not final/
# with the merged model and its card, written after TRL's last push); TRL's trainer is
# given no eval set; resuming and trackers are the run's own settings, checked first.
_PUSH = (
    "is not honoured: collab train pushes nothing to the Hub",
    "upload the trained model when the run ends: hf upload USER/NAME OUT/final "
    "(it holds the model card)",
)
_EVAL = (
    "is not honoured: TRL's trainer is given no eval set",
    "score a held-out set with --eval-data (and --eval-steps, train grpo|relay|eapo|rsim), "
    "or evaluate OUT/final with collab eval",
)
REFUSED_TRL_KEYS = {
    "output_dir": ("is set by collab train", "use --out instead"),
    "resume_from_checkpoint": ("is not read by collab train", "pass --resume instead"),
    "report_to": ("is collab train's report_to", "set report_to instead (--set report_to=NAME)"),
    **dict.fromkeys(
        (
            "push_to_hub",
            "hub_model_id",
            "hub_strategy",
            "hub_token",
            "hub_private_repo",
            "hub_always_push",
            "hub_revision",
        ),
        _PUSH,
    ),
    **dict.fromkeys(
        ("do_eval", "eval_strategy", "eval_steps", "eval_on_start", "load_best_model_at_end"),
        _EVAL,
    ),
}


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


def trl_args(args_class: type[T], settings: dict[str, Any]) -> T:
    """TRL's arguments object (`GRPOConfig`, `SFTConfig`) from `settings`; what TRL
    refuses there (e.g. a generation batch that splits a group) is a one-line UserError."""
    try:
        return args_class(**settings)
    except (TypeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"invalid TRL settings: {first}", "fix the trl.* values") from err


def check_trl_keys(trl: dict[str, Any], args_class: type) -> None:
    """A mistyped `trl.KEY` fails before the model loads; the keys a run cannot honour
    (`REFUSED_TRL_KEYS`) are refused, whatever their value."""
    known = {f.name for f in dataclasses.fields(args_class)}
    for key in trl:
        if key in REFUSED_TRL_KEYS:
            why, fix = REFUSED_TRL_KEYS[key]
            raise UserError(f"trl.{key} {why}", fix)
        if key not in known:
            raise UserError(
                f"trl.{key} is not a TRL {args_class.__name__} argument",
                f"see TRL's {args_class.__name__} reference",
            )


def quiet_trl_notices() -> None:
    """Stop two warnings that every run printed and no setting of ours can avoid: TRL
    calling `rollout_func` experimental (the TRL versions it works with are bounded in
    pyproject.toml and tested), and TRL reading transformers' deprecated
    `is_gradient_checkpointing` at each step. Filtered by message for this process only:
    every other warning still shows."""
    warnings.filterwarnings("ignore", message=".*'rollout_func'", category=UserWarning)
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)


@contextmanager
def started_run(
    config: Any,
    out: Path,
    resumable: frozenset[str],
    max_steps: int | None = None,
    omit: frozenset[str] = frozenset(),
) -> Iterator[str | None]:
    """Bind `out` to `config` and give the checkpoint to resume from (None: a fresh
    run). Refused, before anything is written: `--resume` without a checkpoint, a fresh
    run over another run's checkpoints, another experiment's folder, and resuming a run
    that already reached `max_steps` (transformers would train one step past it). A
    run that fails inside the block before logging a step (a user's reward function
    that raises at the first batch) leaves no folder it made (`runs.run_folder`). The
    keys in `omit`, which the run never reads, are not saved (`unread_keys`)."""
    checkpoint = last_checkpoint(out / CHECKPOINTS, config.resume)
    if checkpoint and max_steps is not None and checkpoint_step(checkpoint) >= max_steps:
        raise UserError(
            f"{out} already reached step {checkpoint_step(checkpoint)} of {max_steps}",
            "raise --steps to train further, or evaluate OUT/final with collab eval",
        )
    with runs.run_folder(config, out, resumable, (out / METRICS,), is_main_process(), omit):
        for log in (out / METRICS, out / ROLLOUTS):
            if log.exists():
                keep_metrics_until(log, checkpoint_step(checkpoint) if checkpoint else 0)
        yield checkpoint


def resumed_config(config: T, out: Path) -> T | None:
    """The config a run resumed into `out` was started with (its config.yaml, as the run
    folder saved it: what it left out reads as the defaults), whose pinned numbers it
    keeps; None for a fresh run."""
    saved = out / runs.CONFIG
    if not (getattr(config, "resume", False) and saved.is_file()):
        return None
    # Read as this command's config: an eval's or a warm-up's folder is refused by name.
    return runs.saved_config(type(config), out)


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


def keep_metrics_until(path: Path, step: int) -> None:
    """Drop the logs after `step` (0: all of them): a resumed run logs those steps again."""
    kept = [r for r in runs.read_records(path) if r.get("step", 0) <= step]
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)  # a rewrite cut short earlier left one: never append to it
    with runs.RecordWriter(tmp) as writer:
        for record in kept:
            writer.write(record)
    os.replace(tmp, path)


def recorder(
    writer: runs.RecordWriter,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> TrainerCallback:
    """A callback writing every TRL log to metrics.jsonl, moving a progress bar and
    handing `report` one line per logged step (`step_line`: what a batch log keeps when
    no bar is drawn). Built here so that importing this module does not import
    transformers; add it after the callbacks that put values into the logs."""
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.began, self.first_step = time.perf_counter(), state.global_step

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if progress is not None:
                progress(state.global_step, state.max_steps)

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if not (state.is_world_process_zero and logs):
                return
            writer.write({"step": state.global_step, "epoch": state.epoch, **logs})
            done = state.global_step - self.first_step
            if report is not None and done > 0 and "train_runtime" not in logs:
                per_step = (time.perf_counter() - self.began) / done
                report(step_line(logs, state.global_step, state.max_steps, per_step))

    return Recorder()


# What a step's line shows of its logs, when they have it: name -> TRL log key. GRPO's
# loss says little (advantages are centred), so it shows where no reward is logged (SFT).
STEP_LINE_KEYS = {
    "reward": "reward",
    "accuracy": "episodes/accuracy",
    "call ratio": "episodes/call_ratio",
    "calls": "episodes/calls",
    "experts cut": "episodes/expert_truncated",  # eapo: replies cut at the expert's cap
}


def step_line(logs: dict[str, Any], step: int, max_steps: int, per_step: float) -> str:
    """`step 3/20 · reward 0.250 · accuracy 0.250 · 41.2 s/step · ETA 11m 40s`."""
    parts = [f"step {step}/{max_steps}"]
    if "reward" not in logs and "loss" in logs:
        parts.append(f"loss {logs['loss']:.3f}")
    parts += [f"{name} {logs[key]:.3f}" for name, key in STEP_LINE_KEYS.items() if key in logs]
    eta = round(per_step * max(max_steps - step, 0))
    parts += [f"{per_step:.1f} s/step", f"ETA {eta // 60}m {eta % 60:02d}s"]
    return " · ".join(parts)


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


def plot_curves(
    history: list[dict[str, Any]], path: Path, keys: tuple[str, ...], title: str
) -> None:
    """One panel per key the run logged other than as zeros throughout (a grpo run's call
    counts), against the optimizer step (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [k for k in keys if any(h.get(k) for h in history)]
    if not drawn:
        return
    cols = min(len(drawn), 4)  # a wide run (rsim logs eight series) wraps into rows
    rows = -(-len(drawn) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(drawn) :]:
        ax.axis("off")
    for ax, key in zip(axes.flat, drawn, strict=False):
        points = [(h["step"], h[key]) for h in history if key in h]
        ax.plot([s for s, _ in points], [v for _, v in points], marker=".", color="tab:blue")
        ax.set_title(key)
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
