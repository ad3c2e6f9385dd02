"""Held-out evaluation during training (`eval_steps`): every N steps the live policy is
scored greedily on `eval_data`, as `collab eval` scores it, into `eval-step-N/`, and
the scores join metrics.jsonl as `eval/*` (and the curves). `held_out_config` is that
evaluation's config, also the one of the end-of-run evaluation (`train/grpo.py`).

Under `accelerate launch` every process evaluates a share of the held-out samples and
the main process writes them: unwrapping the model for generation gathers ZeRO-3's
partitioned weights, a collective every process must enter (one process alone would
wait in it for ever), and under DDP the others would wait for the evaluation in the
next step's first collective until `ddp_timeout` ended the job.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl import runs
from collabrl.config import SamplingConfig

if TYPE_CHECKING:
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from collabrl.eval.config import EvalConfig
    from collabrl.train.resolve import ResolvedRun
    from collabrl.train.rollout import ProtocolRollout


def held_out_config(
    run: ResolvedRun,
    out: Path,
    model: str,
    prompt: str | None,
    trained: Path | None = None,
) -> EvalConfig:
    """The `collab eval` run of the held-out set for `model`: greedy, with the run's
    protocol as its method evaluates it (eapo's expert channel locked, rSIM's planner
    greedy, the one trained in the run folder `trained` for the trained policy) and the
    prompt the policy trained with (none for a protocol that brings its own)."""
    from collabrl.eval.config import EvalConfig

    config = run.config
    protocol = run.method.held_out(run.protocol, trained)
    return EvalConfig(
        benchmark=config.eval_data,
        problem_field=config.problem_field,
        answer_field=config.answer_field,
        id_field=config.id_field,
        split=config.eval_split,
        model=model,
        prompt=prompt,
        limit=config.eval_limit,
        out=str(out),
        protocol=protocol,
        sampling=SamplingConfig(max_tokens=config.sampling.max_tokens, temperature=0.0),
        engine=config.engine,
    )


# The held-out metrics a training run reports: each step's evaluation logs them as
# eval/<key>; `collab train`, the model card and the HTML page show them start vs trained.
LOGGED = ("pass@1", "call_ratio", "mean_completion_tokens")


def held_out_callback(
    run: ResolvedRun,
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
    config = run.config

    class HeldOut(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = state.global_step
            if step % config.eval_steps:
                return
            eval_config = held_out_config(run, out / f"eval-step-{step}", config.model, prompt)
            metrics = evaluate_live(trainer, rollout, eval_config)  # on every process
            if metrics is None:  # not the main process
                return
            writer.write(
                {"step": step, **{f"eval/{k}": metrics[k] for k in LOGGED if k in metrics}}
            )
            if report is not None:
                report(
                    f"held-out {config.eval_data} at step {step}: pass@1 {metrics['pass@1']:.3f}"
                )

    return HeldOut()


def evaluate_live(
    trainer: GRPOTrainer, rollout: ProtocolRollout, eval_config: EvalConfig
) -> dict[str, Any] | None:
    """`collab eval` of the model being trained, through the rollout's own engine. Every
    process calls it: each samples its share of the units (the i-th of every
    `num_processes`), the main process writes them all into the folder and returns the
    metrics; the others return None."""
    from accelerate.utils import gather_object

    from collabrl.eval.runner import (
        finished_units,
        plan_eval,
        prepare_run_folder,
        run_eval,
        sample_units,
        score_run,
    )
    from collabrl.protocols.sampling import units_of

    accelerator = trainer.accelerator
    if accelerator.num_processes == 1:  # written as they finish, resumable as collab eval
        with rollout.live_engine(trainer) as engine:
            return run_eval(eval_config, engine=engine).metrics
    plan = plan_eval(eval_config, check_model=False)
    out_dir = Path(eval_config.out)  # held_out_config names it
    if accelerator.is_main_process:
        prepare_run_folder(eval_config)
    accelerator.wait_for_everyone()  # the folder, with what a killed run finished, is there
    done = finished_units(out_dir)
    units = units_of(plan.bench.items, eval_config.sampling.n)
    share = units[accelerator.process_index :: accelerator.num_processes]
    records: list[dict[str, Any]] = []
    with rollout.live_engine(trainer) as engine:
        sample_units(plan, share, done, engine, records.append)
    gathered = gather_object(records)  # every process's records, in process order
    if not accelerator.is_main_process:
        return None
    with runs.RecordWriter(out_dir / runs.SAMPLES) as samples:
        for record in gathered:
            samples.write(record)
    return score_run(plan, out_dir)
