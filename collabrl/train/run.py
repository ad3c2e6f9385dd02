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
import math
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from collabrl import runs
from collabrl.errors import UserError
from collabrl.train.checkpoints import checkpoint_step, last_checkpoint
from collabrl.train.launch import is_main_process

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from transformers import TrainerCallback

    from collabrl.protocols.spec import ProtocolSpec

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


def keep_metrics_until(path: Path, step: int) -> None:
    """Drop the logs after `step` (0: all of them): a resumed run logs those steps again."""
    runs.write_records(path, [r for r in runs.read_records(path) if r.get("step", 0) <= step])


def recorder(
    writer: runs.RecordWriter,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
    keys: dict[str, str] | None = None,
) -> TrainerCallback:
    """A callback writing every TRL log to metrics.jsonl, moving a progress bar and
    handing `report` one line per logged step (`step_line` of `keys`, default
    STEP_LINE_KEYS: what a batch log keeps when no bar is drawn). Built here so that
    importing this module does not import transformers; add it after the callbacks that
    put values into the logs."""
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.began, self.first_step = time.perf_counter(), state.global_step
            if progress is not None:  # the steps' phase begins, a resumed run's too
                progress(state.global_step, state.max_steps)

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
                line = step_line(logs, state.global_step, state.max_steps, per_step, keys)
                report(line)

    return Recorder()


# What a step's line shows of its logs, when they have it: name -> TRL log key. GRPO's
# loss says little (advantages are centred), so it shows where no reward is logged (SFT).
SCORE_KEYS = {"reward": "reward", "accuracy": "episodes/accuracy"}
# The calls for help, which every episode logs: shown only where the protocol has a
# collaborator whose tokens count as help (`step_line_keys`).
CALL_KEYS = {
    "call ratio": "episodes/call_ratio",
    "calls": "episodes/calls",
    "experts cut": "episodes/expert_truncated",  # eapo: replies cut at the expert's cap
}
STEP_LINE_KEYS = SCORE_KEYS | CALL_KEYS


def step_line_keys(spec: ProtocolSpec) -> dict[str, str]:
    """What the step line of a run on `spec`'s protocol shows: the calls only where they
    can happen (a relay teacher, consult's experts), not a solo, tool or planner run's
    constant 0.000."""
    from collabrl.episode import HELPERS

    helped = any(c.author in HELPERS for c in spec.collaborators)
    return STEP_LINE_KEYS if helped else SCORE_KEYS


def step_line(
    logs: dict[str, Any],
    step: int,
    max_steps: int,
    per_step: float,
    keys: dict[str, str] | None = None,
) -> str:
    """`step 3/20 · reward 0.250 · accuracy 0.250 · 41.2 s/step · ETA 11m 40s`: of `keys`
    (default STEP_LINE_KEYS), those the step logged."""
    parts = [f"step {step}/{max_steps}"]
    if "reward" not in logs and "loss" in logs:
        parts.append(f"loss {logs['loss']:.3f}")
    shown = STEP_LINE_KEYS if keys is None else keys
    parts += [f"{name} {logs[key]:.3f}" for name, key in shown.items() if key in logs]
    eta = round(per_step * max(max_steps - step, 0))
    parts += [f"{per_step:.1f} s/step", f"ETA {eta // 60}m {eta % 60:02d}s"]
    return " · ".join(parts)


def logged_number(value: Any) -> float | None:
    """A logged value as a finite float, or None (absent, text, NaN, a bool): a run
    folder's records are read as written by anything, so nothing else is plotted."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def series(history: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(step, value) of every record that logged `key` and its step as finite numbers."""
    return [
        (step, value)
        for h in history
        if (step := logged_number(h.get("step"))) is not None
        and (value := logged_number(h.get(key))) is not None
    ]


def curve_keys(history: list[dict[str, Any]], keys: tuple[str, ...]) -> list[str]:
    """The `keys` drawn as curves: each the run logged other than as zeros throughout
    (a grpo run's call counts where nothing could call)."""
    return [k for k in keys if any(y for _, y in series(history, k))]


def curves_figure(
    history: list[dict[str, Any]], keys: tuple[str, ...], title: str | None = None
) -> Figure | None:
    """One panel per `curve_keys` key against the optimizer step (the Agg backend: no
    display needed), or None when there is none. The one drawing of a run's curves:
    train_curves.png (`plot_curves`) and the run page (`collab view --html`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = curve_keys(history, keys)
    if not drawn:
        return None
    cols = min(len(drawn), 4)  # a wide run (rsim logs eight series) wraps into rows
    rows = -(-len(drawn) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(drawn) :]:
        fig.delaxes(ax)
    for ax, key in zip(axes.flat, drawn, strict=False):
        points = series(history, key)
        ax.plot([s for s, _ in points], [v for _, v in points], marker=".", color="tab:blue")
        ax.set_title(key)
        ax.set_xlabel("step")
    if title is not None:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_curves(
    history: list[dict[str, Any]], path: Path, keys: tuple[str, ...], title: str
) -> None:
    """`curves_figure` saved as the PNG at `path`; nothing when it draws no panel."""
    fig = curves_figure(history, keys, title)
    if fig is None:
        return
    import matplotlib.pyplot as plt  # after curves_figure chose the Agg backend

    fig.savefig(path, dpi=100)
    plt.close(fig)
