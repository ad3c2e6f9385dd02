"""`collab train grpo|relay|eapo|rsim`: TRL's GRPOTrainer over a protocol's Episodes.

One trainer for the methods that differ only in their protocol and reward: `grpo`
(the solo protocol, correctness reward: both papers' self-exploratory baseline),
`relay` (RelayLLM: the relay protocol with a teacher, its simple or difficulty-aware
reward), `eapo` (EAPO: the consult protocol with an expert pool, its F1 reward,
the ρ_s and turn-budget schedules, DAPO's clip) and `rsim` (rSIM: the strategy
protocol, whose planner trains beside the reasoner, `train/rsim.py`). The rollout
(`train/rollout.py`) runs the protocol on the live model; the reward functions
(`train/rewards.py`) read the Episodes' extras. This module is the command's entry:
the config is `train/grpo_config.py`, the trainer `train/trainer.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.data.benchmarks import Fields, load_benchmark
from collabrl.engines.endpoints import check_collaborator
from collabrl.eval.metrics import sign_test
from collabrl.models import resolve_model
from collabrl.protocols.config import ProtocolConfig
from collabrl.train.grpo_config import (
    RESUMABLE_KEYS,
    GRPOTrainConfig,
    held_out_config,
    rollout_protocol,
    training_prompt,
)
from collabrl.train.rsim import PLANNER_DIR
from collabrl.train.run import FINAL, quiet_trl_notices, start_run
from collabrl.train.schedules import pin_horizons
from collabrl.train.trainer import TrainResult, run_grpo


def train_grpo(
    config: GRPOTrainConfig,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> TrainResult:
    """Run (or resume) a GRPO training run into its folder; `progress(done, total)` is
    called with optimizer steps (and the held-out evaluations' samples), `report` with a
    line per step and per evaluation."""
    config.check()
    quiet_trl_notices()
    resolve_model(config.model)  # a mistyped --model fails before the run folder exists
    for ref in collaborators_of(rollout_protocol(config)):
        check_collaborator(ref, config.engine.api_key)  # down or wrong: before any work
    bench = load_benchmark(config.data, Fields.of(config), config.limit)
    out = runs.out_folder(config.out, f"train-{config.method}", config.data, config.model)
    if config.eval_data is not None:
        # A typo or a wrong column fails now, not after training.
        held_out = held_out_config(config, Path("checks-only"), config.model, None)
        load_benchmark(config.eval_data, Fields.of(held_out), config.eval_limit)
    # "0: the whole run" horizons become numbers in config.yaml: a resume keeps them.
    config = pin_horizons(config, out)
    checkpoint = start_run(config, out, RESUMABLE_KEYS, config.steps)
    result = run_grpo(config, bench, out, checkpoint, progress, report)
    if config.eval_data is not None and is_main_process():
        # The policy is evaluated with the prompt it trained with (none for a protocol
        # that brings its own).
        prompt = training_prompt(config, bench.prompt)
        result.evaluation = evaluate_run(config, out, prompt, progress, report)
        runs.write_json(out / "eval.json", result.evaluation)
    return result


def collaborators_of(protocol: ProtocolConfig) -> list[str]:
    """The models the rollout protocol calls beside the policy: relay's teacher, consult's
    experts (rsim's planner trains in-process; the protocol's own check reads it)."""
    return [ref for ref in (protocol.teacher, *protocol.experts) if ref]


def is_main_process() -> bool:
    """Under `accelerate launch`, whether this is the process that evaluates and prints."""
    from accelerate import PartialState

    return PartialState().is_main_process


def evaluate_run(
    config: GRPOTrainConfig,
    out: Path,
    prompt: str | None,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Greedy held-out metrics of the starting and the trained policy, each in its own
    `collab eval` folder (resumable), with the run's protocol; eapo's channel locked, as
    the paper evaluates it. `progress` moves over each evaluation's samples."""
    from collabrl.eval.runner import run_eval

    results = {}
    for name, model in (("start", config.model), ("final", str(out / FINAL))):
        # rsim: with the planner that ran beside this reasoner
        planner = config.protocol.planner if name == "start" else str(out / PLANNER_DIR)
        eval_config = held_out_config(config, out / f"eval-{name}", model, prompt, planner)
        if report is not None:
            report(f"held-out {config.eval_data}: evaluating the {name} policy")
        results[name] = run_eval(eval_config, progress=progress).metrics
    results["paired"] = paired_change(out / "eval-start", out / "eval-final")
    return results


def paired_change(start: Path, final: Path) -> dict[str, float]:
    """The same held-out problems before and after (greedy: one sample each): how many the
    training newly solved and lost, and the sign test's p-value of that split (a gain of
    a few problems out of hundreds is often noise; this says how often)."""
    before, after = runs.samples_by_item(start, 1), runs.samples_by_item(final, 1)
    gained = sum(after[i][0]["correct"] and not before[i][0]["correct"] for i in before)
    lost = sum(before[i][0]["correct"] and not after[i][0]["correct"] for i in before)
    return {"gained": gained, "lost": lost, "p_value": sign_test(gained, lost)}
