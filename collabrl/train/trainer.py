"""Wire a GRPO run: the live model in an engine, the protocol around it, TRL's trainer,
and the run folder's records (`collabrl.train.run`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from collabrl.data.benchmarks import Benchmark
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.eval import records
from collabrl.protocols.build import build_protocol
from collabrl.train.run import CURVES, FINAL, METRICS, plot_curves, recorder, save_final

if TYPE_CHECKING:
    from collabrl.train.grpo import GRPOTrainConfig, TrainResult

# The curves drawn from metrics.jsonl, when a run logged them.
CURVE_KEYS = (
    "reward",
    "episodes/accuracy",
    "completions/mean_length",
    "episodes/call_ratio",
    "episodes/calls",
    "episodes/accepted_calls",
    "episodes/format_errors",
    "accept_prob",
)


def run_grpo(
    config: GRPOTrainConfig,
    bench: Benchmark,
    out: Path,
    checkpoint: str | None,
    progress: Callable[[int, int], None] | None = None,
) -> TrainResult:
    """Train from scratch or from `checkpoint`, writing the run folder."""
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    from collabrl.engines.hf import TransformersEngine
    from collabrl.models import load_model, load_tokenizer, resolve_model
    from collabrl.train.grpo import TrainResult, dataset_of, grpo_args, rollout_protocol
    from collabrl.train.rewards import reward_functions
    from collabrl.train.rollout import ProtocolRollout
    from collabrl.train.schedules import ScheduleCallback

    ref = resolve_model(config.model)
    model = load_model(ref)
    tokenizer = load_tokenizer(ref)
    engine = TransformersEngine(model, tokenizer, config.engine.batch_size, config.model)
    # consult brings EAPO's own prompts; the other protocols use the data's (or --prompt).
    template = None if config.method == "eapo" else get_prompt(config.prompt or bench.prompt)
    protocol = build_protocol(
        rollout_protocol(config),
        config.model,
        config.engine,
        template,
        bench.extract_fallback,
        policy_engine=engine,
    )
    params = SamplingParams(
        max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed
    )
    rollout = ProtocolRollout(protocol, engine, bench.items, params, config.num_generations)
    # eapo's schedule puts accept_prob and turn_budget into the logs the recorder writes.
    schedule = [ScheduleCallback(config.schedule, protocol)] if config.method == "eapo" else []
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_functions(config),
        args=grpo_args(config, out),
        train_dataset=dataset_of(bench),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=schedule,
    )
    trainer.remove_callback(PrinterCallback)  # metrics.jsonl has every log
    try:
        with records.RecordWriter(out / METRICS) as writer:
            trainer.add_callback(recorder(writer, progress))
            trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        protocol.close()
    save_final(trainer, out / FINAL)
    history = records.read_records(out / METRICS)
    title = f"{config.method} · {Path(config.model.rstrip('/')).name} on {Path(config.data).name}"
    plot_curves(history, out / CURVES, CURVE_KEYS, title)
    return TrainResult(out, trainer.state.global_step, history)
