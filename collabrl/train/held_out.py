"""Held-out evaluation during training (`eval_steps`): every N steps the live policy is
scored greedily on `eval_data`, as `collab eval` scores it, into `eval-step-N/`, and
the scores join metrics.jsonl as `eval/*` (and the curves)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl import runs
from collabrl.train.grpo_config import GRPOTrainConfig, held_out_config

if TYPE_CHECKING:
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from collabrl.train.rollout import ProtocolRollout

# What a step's held-out evaluation logs of its metrics, as eval/<key>.
LOGGED = ("pass@1", "call_ratio", "mean_completion_tokens")


def held_out_callback(
    config: GRPOTrainConfig,
    trainer: GRPOTrainer,
    rollout: ProtocolRollout,
    prompt: str | None,
    writer: runs.RecordWriter,
    report: Callable[[str], None] | None,
) -> TrainerCallback:
    """A callback scoring the live policy every `config.eval_steps` steps (built here so
    that importing this module does not import transformers)."""
    from transformers import TrainerCallback

    out = Path(trainer.args.output_dir).parent

    class HeldOut(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = state.global_step
            if step % config.eval_steps or not state.is_world_process_zero:
                return
            eval_config = held_out_config(config, out / f"eval-step-{step}", config.model, prompt)
            metrics = evaluate_live(trainer, rollout, eval_config)
            writer.write(
                {"step": step, **{f"eval/{k}": metrics[k] for k in LOGGED if k in metrics}}
            )
            if report is not None:
                report(
                    f"held-out {config.eval_data} at step {step}: pass@1 {metrics['pass@1']:.3f}"
                )

    return HeldOut()


def evaluate_live(trainer: GRPOTrainer, rollout: ProtocolRollout, eval_config: Any) -> dict:
    """`collab eval` of the model being trained, through the rollout's own engine."""
    from collabrl.eval.runner import run_eval

    with rollout.live_engine(trainer) as engine:
        return run_eval(eval_config, engine=engine).metrics
