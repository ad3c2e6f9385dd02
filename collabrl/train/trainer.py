"""Wire a GRPO run: the live model in an engine, the protocol around it, TRL's trainer
(or the method's), and the run folder's records (`collabrl.train.run`). It reads the
resolved run (`train/resolve.py`): what differs by method its spec says."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl import runs
from collabrl.data.benchmarks import Benchmark
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.protocols.build import build_protocol
from collabrl.train.final import save_final
from collabrl.train.run import (
    CURVES,
    FINAL,
    METRICS,
    ROLLOUTS,
    plot_curves,
    recorder,
    step_line_keys,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import GRPOTrainer

    from collabrl.engines.hf import TransformersEngine
    from collabrl.protocols.base import CollabProtocol
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.resolve import ResolvedRun
    from collabrl.train.rollout import ProtocolRollout, RolloutLog

# The curves drawn from metrics.jsonl, when a run logged them.
CURVE_KEYS = (
    "reward",
    "episodes/accuracy",
    "eval/pass@1",
    "completions/mean_length",
    "episodes/call_ratio",
    # Groups whose rewards (TRL's) or samples (ours) are all equal: advantage 0, no signal.
    "frac_reward_zero_std",
    "episodes/identical_groups",
    "episodes/calls",
    "episodes/consult_rate",  # EAPO's Figure 4: the share of episodes that consulted
    "episodes/accepted_calls",
    "episodes/expert_truncated",  # expert answers cut at expert_max_tokens
    "episodes/format_errors",
    "episodes/tool_calls",
    "episodes/tool_errors",
    "accept_prob",
    # rsim: the reasoner's follow reward, the planner's reward and its parts, λ.
    "rewards/follow/mean",
    "planner/reward",
    "planner/terminal",
    "planner/penalty",
    "planner/lambda",
    # vLLM rollouts: the share of sequences TRL's sequence mask would have dropped.
    "is/sequence_mask_drop",
)


@dataclass
class TrainResult:
    """A finished (or resumed to its end) GRPO run: its folder, steps and logs."""

    out_dir: Path
    steps: int
    history: list[dict[str, Any]] = field(default_factory=list)
    # "start" and "final": the held-out metrics of the starting and the trained policy.
    evaluation: dict[str, dict[str, Any]] = field(default_factory=dict)


def dataset_of(bench: Benchmark) -> Any:
    """The training set TRL sees: one row per problem, its id as the prompt (the rollout
    looks the problem up by id, see train/rollout.py)."""
    import datasets

    return datasets.Dataset.from_list([{"prompt": item.id} for item in bench.items])


def run_grpo(
    run: ResolvedRun,
    bench: Benchmark,
    out: Path,
    checkpoint: str | None,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train from scratch or from `checkpoint`, writing the run folder; `report` gets a
    line per step."""
    from transformers import PrinterCallback

    config = run.config
    trainer, protocol = build_trainer(run, bench, out, checkpoint)
    trainer.remove_callback(PrinterCallback)  # metrics.jsonl has every log
    try:
        with runs.RecordWriter(out / METRICS) as writer:
            if config.eval_steps:
                from collabrl.train.held_out import held_out_callback

                prompt = run.prompt(bench.prompt)
                rollout = trainer.rollout_func
                callback = held_out_callback(run, trainer, rollout, prompt, writer, report)
                trainer.add_callback(callback)
            keys = step_line_keys(run.protocol_spec)  # no calls where none can be
            trainer.add_callback(recorder(writer, progress, report, keys))
            trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        protocol.close()
    save_final(trainer, out / FINAL, config.lora, config.final_dtype)
    history = runs.read_records(out / METRICS)
    title = f"{config.method} · {Path(config.model.rstrip('/')).name} on {Path(config.data).name}"
    plot_curves(history, out / CURVES, CURVE_KEYS, title)
    run.method.finish(trainer, out, history, title)  # rsim: the trained planner
    return TrainResult(out, trainer.state.global_step, history)


def build_trainer(
    run: ResolvedRun, bench: Benchmark, out: Path, checkpoint: str | None
) -> tuple[GRPOTrainer, CollabProtocol]:
    """The trainer of a run, and the protocol its rollouts use (the caller closes it):
    the live model in an engine, the protocol around it, TRL's trainer or the one its
    method names (rSIM's, with the planner of `checkpoint` when resuming)."""
    from trl import GRPOTrainer

    from collabrl.models import load_model, load_tokenizer, resolve_model
    from collabrl.train.grpo_args import grpo_args, policy_dtype
    from collabrl.train.importance import watch_sequence_mask
    from collabrl.train.model_card import keep_trl_card_out
    from collabrl.train.prompt_length import longest_prompt
    from collabrl.train.rewards import reward_functions
    from collabrl.train.rollout import RolloutLog, log_scored_rollouts

    config = run.config
    if config.steps == 0:  # TRL would read max_steps 0 as num_train_epochs (3)
        raise ValueError("steps 0 (one epoch) is resolved by grpo_args.pin_steps first")
    # TRL's arguments set up the distributed state, which makes "cuda" (engine.device auto)
    # this process's own GPU under `accelerate launch`: built before the collaborators
    # load, so that they do not all land on GPU 0.
    args = grpo_args(config, out, longest_prompt(run, bench))
    ref = resolve_model(config.model)
    # On the CPU in the dtype training holds it in, whatever engine.dtype and
    # engine.device say: accelerate moves the model. transformers 5 builds it on the meta
    # device and reads the weights in once (its only way: low_cpu_mem_usage is gone), so
    # the dtype sets each process's host memory.
    model = load_model(ref, dtype=policy_dtype(args), device="cpu")
    tokenizer = load_tokenizer(ref)
    log = RolloutLog(out / ROLLOUTS, config.save_rollouts) if config.save_rollouts else None
    rollout = training_rollout(run, bench, model, tokenizer, checkpoint, log)
    protocol = rollout.protocol
    try:
        # The method's callbacks (eapo's schedules) put their values into the logs the
        # recorder writes; its trainer (rSIM's) where TRL's is not enough.
        callbacks = run.method.callbacks(config, protocol)
        trainer_class, extra = GRPOTrainer, {}
        if run.method.trainer is not None:
            trainer_class, extra = run.method.trainer(config, protocol)
        trainer = trainer_class(
            model=model,
            reward_funcs=reward_functions(config),
            args=args,
            train_dataset=dataset_of(bench),
            processing_class=tokenizer,
            rollout_func=rollout,
            callbacks=callbacks,
            peft_config=config.lora.peft_config(),
            **extra,
        )
    except BaseException:
        protocol.close()
        raise
    watch_sequence_mask(trainer)  # logs is/sequence_mask_drop: what TRL's default would drop
    keep_trl_card_out(trainer)  # final/README.md is the run's card
    log_scored_rollouts(trainer, rollout)  # rollouts.jsonl, with rewards and advantages
    return trainer, protocol


def training_rollout(
    run: ResolvedRun,
    bench: Benchmark,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    checkpoint: str | None = None,
    log: RolloutLog | None = None,
) -> ProtocolRollout:
    """The rollout of a run over `model` (the live model TRL trains): the policy engine,
    the run's rollout protocol with its collaborators (as its method resumes it from
    `checkpoint`), and the sampling parameters; `log` keeps a sample of every step's
    episodes. The caller closes `rollout.protocol`."""
    from collabrl.train.rollout import ProtocolRollout

    config = run.config
    engine = policy_engine(config, model, tokenizer)
    # A protocol whose spec brings its paper's prompts gets none; the others the data's.
    prompt = run.prompt(bench.prompt)
    template = None if prompt is None else get_prompt(prompt)
    protocol_config = run.protocol
    if checkpoint is not None:
        protocol_config = run.method.resumed(protocol_config, checkpoint)
    protocol = build_protocol(
        protocol_config,
        config.model,
        run.method.collaborators_engine(config.engine),
        template,
        bench.extract_fallback,
        policy_engine=engine,
    )
    params = SamplingParams.of(config.sampling, seed=config.seed)
    return ProtocolRollout(protocol, engine, bench.items, params, config.sampling.n, log)


def policy_engine(
    config: GRPOTrainConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> TransformersEngine:
    """The engine over the live model, with the options `collab eval` gives the policy's
    engine (`create_engine`): above all its chat-template options, so the policy trains
    on the prompts it is evaluated on (Qwen3 with enable_thinking false in both)."""
    from collabrl.engines.hf import TransformersEngine

    return TransformersEngine(
        model,
        tokenizer,
        config.engine.batch_size,
        config.model,
        prefix_cache=config.engine.prefix_cache,
        chat_template_kwargs=config.engine.chat_template_kwargs,
        prefix_cache_mb=config.engine.prefix_cache_mb,
        continuous=config.engine.continuous_batching,
    )
