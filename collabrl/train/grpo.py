"""`collab train grpo|relay|eapo|rsim`: TRL's GRPOTrainer over a protocol's Episodes.

One trainer for the methods that differ in their protocol, reward and a few hooks, each
method's in its spec (`train/methods/`): `grpo` (the solo protocol, correctness reward:
both papers' self-exploratory baseline), `relay` (RelayLLM: the relay protocol with a
teacher, its simple or difficulty-aware reward), `eapo` (EAPO: the consult protocol
with an expert pool, its F1 reward, the ρ_s and turn-budget schedules, DAPO's clip) and
`rsim` (rSIM: the strategy protocol, whose planner trains beside the reasoner,
`train/rsim.py`). The rollout (`train/rollout.py`) runs the protocol on the live model;
the reward functions (`train/rewards.py`) read the Episodes' extras. This module is the
command's entry: it takes the run resolved once (`train/resolve.py`); the config is
`train/grpo_config.py`, TRL's arguments of it `train/grpo_args.py`, the trainer
`train/trainer.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.config import EngineConfig, build_config, to_dict
from collabrl.data.benchmarks import Fields, load_benchmark
from collabrl.engines import resolve_kind
from collabrl.engines.endpoints import check_collaborator
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.metrics import sign_test
from collabrl.eval.runner import prepare_run_folder
from collabrl.models import resolve_model
from collabrl.train.grpo_args import check_run, pin_steps
from collabrl.train.grpo_config import RESUMABLE_KEYS, GRPOTrainConfig
from collabrl.train.held_out import held_out_config
from collabrl.train.launch import is_main_process, num_processes, outside_zero3, solo_environment
from collabrl.train.memory import model_shape
from collabrl.train.model_card import grpo_facts, write_model_card
from collabrl.train.prompt_length import training_problems
from collabrl.train.resolve import ResolvedRun, resolve_run
from collabrl.train.run import EVALUATION, FINAL, quiet_trl_notices, started_run
from collabrl.train.schedules import pin_horizons
from collabrl.train.trainer import TrainResult, run_grpo


def train_grpo(
    run: ResolvedRun,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> TrainResult:
    """Run (or resume) a resolved GRPO training run into its folder; `progress(done,
    total)` is called with optimizer steps (and the held-out evaluations' samples),
    `report` with a line per step and per evaluation."""
    config = run.config
    check_run(config)
    quiet_trl_notices()
    resolve_model(config.model)  # a mistyped --model fails before the run folder exists
    for ref in run.collaborators:
        check_collaborator(ref, config.engine.api_key)  # down or wrong: before any work
    bench = load_benchmark(config.data, Fields.of(config), config.limit)
    # Overlong prompts dropped (max_prompt_tokens): before the epoch is counted.
    bench = training_problems(run, bench, report if is_main_process() else None)
    out = runs.out_folder(config.out, f"train-{config.method}", config.data, config.model)
    if config.eval_data is not None:
        # A typo or a wrong column fails now, not after training.
        held_out = held_out_config(run, Path("checks-only"), config.model, None)
        load_benchmark(config.eval_data, Fields.of(held_out), config.eval_limit)
    # "0: one epoch" steps and "0: the whole run" horizons become numbers in config.yaml:
    # a resume keeps them.
    config = pin_steps(config, out, len(bench.items), num_processes())
    run = run.with_config(pin_horizons(config, out))
    config = run.config
    with started_run(config, out, RESUMABLE_KEYS, config.steps, run.unread_keys()) as checkpoint:
        result = run_grpo(run, bench, out, checkpoint, progress, report)
    if not is_main_process():
        return result
    # The card first, so that a failed evaluation leaves one; then again with the scores.
    card = grpo_facts(run, len(bench.items), result.steps, out)
    write_model_card(out / FINAL, card)
    if config.eval_data is not None:
        # The policy is evaluated with the prompt it trained with (none for a protocol
        # that brings its own).
        prompt = run.prompt(bench.prompt)
        free_training_memory()
        evaluate = evaluate_apart if num_processes() > 1 else evaluate_run
        result.evaluation = evaluate(run, out, prompt, progress, report)
        runs.write_json(out / EVALUATION, result.evaluation)
        write_model_card(out / FINAL, dataclasses.replace(card, evaluation=result.evaluation))
    return result


def free_training_memory() -> None:
    """Return the finished training's memory before the end-of-run evaluation loads its
    engine: the trainer (with TRL's colocated vLLM, `trainer.vllm_generation.llm`, and
    the optimizer state) is unreachable once `run_grpo` returns, but held in reference
    cycles until a collection; then hand the freed blocks back to the CUDA driver, where
    the engine's start-up check measures what is free."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluate_run(
    run: ResolvedRun,
    out: Path,
    prompt: str | None,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Greedy held-out metrics of the starting and the trained policy, each in its own
    `collab eval` folder (resumable), with the run's protocol; eapo's channel locked, as
    the paper evaluates it. `progress` moves over each evaluation's samples. An
    evaluation that fails (a GPU out of memory after hours of training) loses nothing of
    the run: what finished goes to eval.json, and a one-line UserError says how to
    evaluate the rest with `collab eval`."""
    from collabrl.eval.runner import run_eval

    evaluations = end_of_run_configs(run, out, prompt)
    results: dict[str, dict[str, Any]] = {}
    for name, eval_config in evaluations.items():
        if report is not None:
            report(f"held-out {run.config.eval_data}: evaluating the {name} policy")
        try:
            # This process loads alone: under a one-process ZeRO-3 launch too.
            with outside_zero3():
                engine = end_of_run_engine(eval_config.engine, eval_config.model, report)
                sized = dataclasses.replace(eval_config, engine=engine)
                results[name] = run_eval(sized, progress=progress).metrics
        except Exception as err:
            unfinished = [c for n, c in evaluations.items() if n not in results]
            raise evaluation_failed(err, out, results, unfinished) from err
    results["paired"] = paired_change(out / "eval-start", out / "eval-final")
    return results


def end_of_run_configs(run: ResolvedRun, out: Path, prompt: str | None) -> dict[str, EvalConfig]:
    """The `collab eval` runs of the end-of-run evaluation: the starting policy, then the
    trained one (with what the run trained beside it: rSIM's planner), each into its own
    folder of the run."""
    start = held_out_config(run, out / "eval-start", run.config.model, prompt)
    final = held_out_config(run, out / "eval-final", str(out / FINAL), prompt, trained=out)
    return {"start": start, "final": final}


def evaluate_apart(
    run: ResolvedRun,
    out: Path,
    prompt: str | None,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """`evaluate_run` in a process of its own, for a run launched as several processes.
    This one is rank 0 of a group (TRL's colocated vLLM rewrote RANK and WORLD_SIZE for
    its engine): a second engine started here would join that group, and accelerate's
    DeepSpeed config, registered for the whole process, would put every load into
    ZeRO-3's partitioning. The child starts without the launch's variables
    (`solo_environment`), called once the trainer's memory is freed; its progress, its
    report lines and its results or one-line error come back through a pipe (its stdout
    and stderr are this process's)."""
    read, write = os.pipe()
    # With this command line: the evaluation folders' config.yaml headers record it.
    request = {"config": to_dict(run.config), "out": str(out), "prompt": prompt, "argv": sys.argv}
    code = f"from collabrl.train.grpo import evaluation_child; evaluation_child({write})"
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            env=solo_environment(),
            pass_fds=(write,),
            text=True,
        )
    finally:
        os.close(write)  # the child's copy is the only writer: the pipe ends when it does
    stdin = child.stdin
    assert stdin is not None  # stdin=PIPE
    outcome: dict[str, Any] = {}
    with os.fdopen(read, encoding="utf-8") as channel:
        try:
            with stdin:
                stdin.write(json.dumps(request))
        except BrokenPipeError:
            pass  # the child ended before reading: its exit code says so below
        for line in channel:
            message = json.loads(line)
            if "progress" in message:
                if progress is not None:
                    progress(*message["progress"])
            elif "report" in message:
                if report is not None:
                    report(message["report"])
            else:
                outcome = message
    status = child.wait()
    if "error" in outcome:
        raise UserError(*outcome["error"])
    if "result" not in outcome:
        crash = RuntimeError(f"its process ended with exit code {status}")
        unfinished = list(end_of_run_configs(run, out, prompt).values())
        raise evaluation_failed(crash, out, {}, unfinished)
    return outcome["result"]


def evaluation_child(channel: int) -> None:
    """The process `evaluate_apart` starts: reads the run's config, folder, prompt and
    command line (as its own) as JSON on stdin, runs `evaluate_run` and writes JSON lines
    to the file descriptor `channel`: {"progress": [done, total]}, {"report": line}, then
    {"result": metrics} or {"error": [problem, fix]}."""
    request = json.load(sys.stdin)
    sys.argv = request["argv"]
    # This process's own run, resolved from the config the training saved.
    run = resolve_run(build_config(GRPOTrainConfig, [request["config"]]))
    with os.fdopen(channel, "w", encoding="utf-8", buffering=1) as pipe:

        def send(**message: Any) -> None:
            pipe.write(json.dumps(message) + "\n")

        try:
            results = evaluate_run(
                run,
                Path(request["out"]),
                request["prompt"],
                lambda done, total: send(progress=[done, total]),
                lambda line: send(report=line),
            )
        except UserError as err:
            send(error=[err.problem, err.fix])
            return
        send(result=results)


def evaluation_failed(
    err: Exception, out: Path, finished: dict[str, dict[str, Any]], unfinished: list[EvalConfig]
) -> UserError:
    """The one-line error of a failed end-of-run evaluation, after keeping what it has:
    the finished evaluations in eval.json, and each unfinished one's config.yaml in its
    folder (with the run's engine settings: a new process has the GPU to itself), which
    `collab eval BENCH -c` resumes."""
    if finished:
        runs.write_json(out / EVALUATION, finished)
    commands = []
    for eval_config in unfinished:
        prepare_run_folder(eval_config)
        saved = Path(eval_config.out) / runs.CONFIG
        commands.append(
            f"collab eval {shlex.quote(eval_config.benchmark)} -c {shlex.quote(str(saved))}"
        )
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return UserError(
        f"the end-of-run evaluation failed ({type(err).__name__}: {reason}); the trained "
        f"run is saved in {out} (final/, metrics.jsonl, curves)",
        "evaluate it with: " + " && ".join(commands),
    )


# The end-of-run evaluation's vLLM takes what is free after training, less this margin
# (the CUDA context, fragmentation): vLLM refuses to start when the share of the GPU it
# is given (gpu_memory_utilization) exceeds the memory free.
FREE_MARGIN = 0.9
# ... and only when that share holds its weights twice over (the weights, then as much
# again for activations and the KV cache); with less the transformers engine evaluates.
VLLM_ROOM = 2.0


def end_of_run_engine(
    engine: EngineConfig, model: str, report: Callable[[str], None] | None
) -> EngineConfig:
    """The engine that evaluates `model` at the end of a run: vLLM (what `auto` picks
    where it is installed) sized from the GPU memory free now, rather than
    `engine.gpu_memory_utilization` of the whole GPU; the transformers engine, with a
    note, when vLLM cannot fit there. Any other engine as configured."""
    import torch

    if resolve_kind(model, engine) != "vllm" or not torch.cuda.is_available():
        return engine  # vLLM's CPU build sizes its cache by engine.kv_cache_mb
    free, total = torch.cuda.mem_get_info()
    shape = model_shape(model)
    # vLLM runs a float32 checkpoint in 16 bits under its `auto` dtype.
    width = 4 if engine.dtype == "float32" else 2
    weights = shape.parameters * width // engine.tensor_parallel_size if shape else 0
    sized = sized_engine(engine, weights, free, total)
    if sized.kind != engine.kind and report is not None:
        report(
            f"vLLM does not fit in the {free / 1024**3:.1f} GiB free after training: "
            "evaluating with the transformers engine"
        )
    return sized


def sized_engine(engine: EngineConfig, weight_bytes: int, free: int, total: int) -> EngineConfig:
    """`engine` (vLLM) given the share of a GPU with `free` of `total` bytes free that
    vLLM may take (at most its configured share), or the transformers engine when that
    share cannot hold `weight_bytes` and room to run them (`VLLM_ROOM`)."""
    share = min(engine.gpu_memory_utilization, FREE_MARGIN * free / total)
    if share * total < VLLM_ROOM * weight_bytes:
        return dataclasses.replace(engine, kind="transformers")
    return dataclasses.replace(engine, gpu_memory_utilization=round(share, 3))


def paired_change(start: Path, final: Path) -> dict[str, float]:
    """The same held-out problems before and after (greedy: one sample each): how many the
    training newly solved and lost, and the sign test's p-value of that split (a gain of
    a few problems out of hundreds is often noise; this says how often)."""
    before, after = runs.samples_by_item(start, 1), runs.samples_by_item(final, 1)
    gained = sum(after[i][0]["correct"] and not before[i][0]["correct"] for i in before)
    lost = sum(before[i][0]["correct"] and not after[i][0]["correct"] for i in before)
    return {"gained": gained, "lost": lost, "p_value": sign_test(gained, lost)}
