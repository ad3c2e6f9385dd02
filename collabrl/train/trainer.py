"""Wire a GRPO run: the live model in an engine, the protocol around it, TRL's trainer,
and the run folder's records (metrics.jsonl per step, a PNG of the curves, the final
model)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl.data.benchmarks import Benchmark
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.protocols.build import build_protocol

if TYPE_CHECKING:
    from collabrl.train.grpo import GRPOTrainConfig, TrainResult

METRICS = "metrics.jsonl"
CURVES = "train_curves.png"
# The curves drawn from metrics.jsonl, when a run logged them.
CURVE_KEYS = (
    "reward",
    "episodes/accuracy",
    "episodes/call_ratio",
    "episodes/calls",
    "episodes/accepted_calls",
    "episodes/format_errors",
)


def run_grpo(
    config: GRPOTrainConfig, bench: Benchmark, out: Path, params: SamplingParams
) -> TrainResult:
    """Train, writing the run folder; see the module docstring."""
    from transformers import TrainerCallback
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
    params = dataclasses.replace(params, temperature=config.temperature, seed=config.seed)
    rollout = ProtocolRollout(protocol, engine, bench.items, params, config.num_generations)

    class MetricsFile(TrainerCallback):
        """Every TRL log line, appended to metrics.jsonl as it comes."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and state.is_world_process_zero:
                with (out / METRICS).open("a") as f:
                    f.write(json.dumps({"step": state.global_step, **logs}) + "\n")

    callbacks: list[Any] = [MetricsFile()]
    if config.method == "eapo":
        # First: it adds accept_prob and turn_budget to the logs MetricsFile writes.
        callbacks.insert(0, ScheduleCallback(config.schedule, protocol))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_functions(config),
        args=grpo_args(config, out),
        train_dataset=dataset_of(bench),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=callbacks,
    )
    try:
        trainer.train(resume_from_checkpoint=True if config.resume else None)
    finally:
        protocol.close()
    trainer.save_model(str(out / "final"))
    tokenizer.save_pretrained(str(out / "final"))
    history = read_metrics(out)
    plot_curves(out, history)
    return TrainResult(out, trainer.state.global_step, history)


def read_metrics(out: Path) -> list[dict[str, Any]]:
    path = out / METRICS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(out: Path, history: list[dict[str, Any]]) -> None:
    """The logged curves against the step, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in CURVE_KEYS if any(k in h for h in history)]
    if not keys:
        return
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        points = [(h["step"], h[key]) for h in history if key in h]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
        ax.set_title(key)
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out / CURVES, dpi=100)
    plt.close(fig)
