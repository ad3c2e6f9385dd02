"""`collab eval`: sample a model on a benchmark, score every sample, summarize.

Work is the list of (problem, sample index) units not yet in `samples.jsonl`;
it is generated in chunks and every finished sample is appended at once, so a
re-run into the same folder only does what is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.config import EngineConfig
from collabrl.data.benchmarks import Benchmark, Fields, fewshot_items, load_benchmark
from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines import Engine, SamplingParams, is_url, resolve_kind
from collabrl.engines.reference import STAND_IN_NOTE
from collabrl.episode import Episode
from collabrl.errors import UserError
from collabrl.eval.config import RESUMABLE_KEYS, EvalConfig
from collabrl.eval.judge import judge_answers
from collabrl.eval.metrics import ProblemSamples, majority_answer, standard_errors, summarize
from collabrl.eval.provenance import chat_template, data_hash, sample_hashes, task_hash
from collabrl.eval.results import RESULTS, Provenance, results_document
from collabrl.eval.usage import episode_usage, usage_metrics
from collabrl.models import resolve_model
from collabrl.protocols import registry
from collabrl.protocols.base import CollabProtocol
from collabrl.protocols.build import DEFAULT_PROMPT, build_protocol, check_protocol
from collabrl.protocols.sampling import Unit, sample_chunks, units_of
from collabrl.protocols.saved import unread_protocol_keys
from collabrl.rewards.score import score_episode

ProgressFn = Callable[[int, int], None]  # (done, total)


@dataclass
class EvalResult:
    out_dir: Path
    metrics: dict[str, Any]
    new_samples: int


def run_eval(
    config: EvalConfig,
    engine: Engine | None = None,
    progress: ProgressFn | None = None,
) -> EvalResult:
    """Run (or resume) an evaluation and write its run folder.

    `engine`, when given, is the policy's engine (left open for the caller);
    otherwise the policy is loaded from `config.model`. Everything that can be checked
    without a model is checked before the run folder is created, so a refused run leaves
    nothing behind.
    """
    plan = plan_eval(config, check_model=engine is None)
    return run_plan(plan, prepare_run_folder(config), lambda: engine, progress)


@dataclass(frozen=True)
class EvalPlan:
    """An evaluation checked as far as it can be without a model or a folder."""

    config: EvalConfig
    bench: Benchmark
    template: PromptTemplate | None


def plan_eval(config: EvalConfig, check_model: bool = True) -> EvalPlan:
    """Check the config, the model reference and the collaborators (unless `check_model`
    is False: the caller, a training run, brings the engine and probed its collaborators
    when it started), the benchmark and the prompt; nothing is loaded or written."""
    config.check()
    if check_model and not is_url(config.model):
        resolve_model(config.model)  # a mistyped --model, without loading it
    bench = load_benchmark(
        config.benchmark,
        Fields.of(config),
        config.limit,
    )
    template = eval_template(config, bench)
    check_protocol(config.protocol, template if config.prompt else None)
    if check_model:  # not at each of a training run's --eval-steps: it asks their servers
        config.check_collaborators()
    return EvalPlan(config, bench, template)


def run_plan(
    plan: EvalPlan,
    out_dir: Path,
    policy_engine: Callable[[], Engine | None],
    progress: ProgressFn | None = None,
) -> EvalResult:
    """Sample what `out_dir` lacks, then score it all into metrics.json and results.json.

    `policy_engine` gives the policy's engine (None: the protocol loads its own). It is
    called only when samples are missing, so a finished run loads no model.
    """
    began = time.perf_counter()
    samples_path = out_dir / runs.SAMPLES
    done = finished_units(out_dir)
    units = units_of(plan.bench.items, plan.config.sampling.n)
    todo = sum(u.key not in done for u in units)
    if todo:
        with runs.RecordWriter(samples_path) as writer:
            sample_units(plan, units, done, policy_engine(), writer.write, progress)
    return EvalResult(out_dir, score_run(plan, out_dir, began), todo)


def finished_units(out_dir: Path) -> set[tuple[str, int]]:
    """The (problem, sample) units whose records `out_dir`'s samples.jsonl holds."""
    return {(r["item_id"], r["sample"]) for r in runs.read_records(out_dir / runs.SAMPLES)}


def sample_units(
    plan: EvalPlan,
    units: list[Unit],
    done: set[tuple[str, int]],
    policy_engine: Engine | None,
    write: Callable[[dict[str, Any]], None],
    progress: ProgressFn | None = None,
) -> None:
    """Sample the `units` not `done` with the plan's protocol around `policy_engine`
    (None: the protocol loads its own), handing each scored record to `write` as it
    finishes (a held-out evaluation on several processes samples a share on each)."""
    config, bench = plan.config, plan.bench
    protocol = build_protocol(
        config.protocol,
        config.model,
        config.engine,
        plan.template,
        bench.extract_fallback,
        policy_engine=policy_engine,
    )
    try:
        _sample(protocol, units, done, config, write, progress)
    finally:
        protocol.close()


def score_run(plan: EvalPlan, out_dir: Path, began: float | None = None) -> dict[str, Any]:
    """Judge (when asked) and score the samples in `out_dir` into its metrics.json, and
    into its results.json with their standard errors, the config, what it takes to
    reproduce the run, the versions, and the time since `began` (a perf_counter)."""
    config = plan.config
    if config.judge:
        _judge(config, plan.bench, out_dir)
    problems, kept = read_problems(out_dir, plan.bench, config.sampling.n)
    metrics = metrics_of(problems, kept, out_dir)
    if registry.uses_reference(config.protocol):
        metrics["stand_in"] = STAND_IN_NOTE  # a run whose helper read the gold answers
    runs.write_json(out_dir / runs.METRICS, metrics)
    stderrs = standard_errors(problems)
    template = used_template(config, plan.template)
    provenance = Provenance(
        prompt=None if template is None else template.record(),
        data_hash=data_hash(plan.bench.items),
        fewshot_ids=[shot.id for shot in template.shots] if template else [],
        fewshot_split=plan.bench.fewshot if config.num_fewshot else None,
        task_hash=task_hash(kept),
        chat_template=chat_template(config.model, config.protocol.tokenizer),
        seconds=None if began is None else round(time.perf_counter() - began, 2),
    )
    problem_count = len(plan.bench.items)
    document = results_document(
        config, plan.bench.name, metrics, stderrs, problem_count, provenance
    )
    runs.write_json(out_dir / RESULTS, document)
    return metrics


def policy_template(config: EvalConfig, bench: Benchmark) -> PromptTemplate | None:
    """The policy prompt: `--prompt`, else the benchmark's for a protocol whose spec
    answers in it (solo); None leaves it to the protocol (relay's template, or the
    paper's own prompts of consult, strategy and apollo)."""
    if config.prompt:
        return get_prompt(config.prompt)
    if registry.get(config.protocol.name).bench_prompt:
        return get_prompt(bench.prompt)
    return None


def eval_template(config: EvalConfig, bench: Benchmark) -> PromptTemplate | None:
    """`policy_template`, showing `--num-fewshot` examples of the benchmark's training
    split before every problem when asked (in the template a protocol without `--prompt`
    falls back to; a protocol with its paper's own prompts is refused them)."""
    template = policy_template(config, bench)
    if not config.num_fewshot:
        return template
    template = used_template(config, template)
    if template is None:
        raise UserError(
            f"the {config.protocol.name} protocol uses its paper's prompts, which show no examples",
            "drop --num-fewshot for this protocol",
        )
    shots = fewshot_items(bench, config.num_fewshot, config.fewshot_seed)
    return template.with_shots(shots, config.fewshot_as_multiturn)


def used_template(config: EvalConfig, template: PromptTemplate | None) -> PromptTemplate | None:
    """The template the policy was prompted with: the plan's, else the one a protocol
    without its own prompts falls back to; None for a protocol with its paper's prompts."""
    if template is not None or registry.get(config.protocol.name).own_prompt:
        return template
    return get_prompt(DEFAULT_PROMPT)


def prepare_run_folder(config: EvalConfig) -> Path:
    """Create the run folder, or check that an existing one ran the same experiment;
    its config.yaml leaves out the other protocols' sections."""
    out_dir = runs.out_folder(config.out, "eval", config.benchmark, config.model)
    unread = unread_protocol_keys(config.protocol)
    runs.prepare_folder(config, out_dir, RESUMABLE_KEYS, (out_dir / runs.SAMPLES,), unread)
    return out_dir


def _sample(
    protocol: CollabProtocol,
    units: list[Unit],
    done: set[tuple[str, int]],
    config: EvalConfig,
    write: Callable[[dict[str, Any]], None],
    progress: ProgressFn | None,
) -> None:
    """Sample the units not `done` in seeded chunks, handing each record to `write`."""
    chunk = chunk_size(config.engine, config.model)
    params = SamplingParams.of(config.sampling)
    todo, written = sum(u.key not in done for u in units), 0
    chunks = sample_chunks(protocol, units, chunk, params, done)
    while True:
        began = time.perf_counter()
        sampled = next(chunks, None)
        if sampled is None:
            break
        # Per unit: the chunk's time over the units it sampled, kept ones or not.
        seconds = (time.perf_counter() - began) / max(len(sampled), 1)
        for unit, episode in sampled:
            write(sample_record(unit, episode, seconds))
        written += len(sampled)
        if progress:
            progress(written, todo)


CONTINUOUS_CHUNK_BATCHES = 4


def chunk_size(engine: EngineConfig, model: str) -> int:
    """How many units go to the engine at once: a kill loses at most one chunk."""
    kind = resolve_kind(model, engine)
    if kind == "openai":
        return engine.max_concurrency
    if kind == "vllm":
        return 256  # vLLM schedules internally; chunks only bound what a kill loses
    if engine.continuous_batching:
        # Rows that finish are replaced from the same call only: a chunk of several
        # batches keeps the batch full until its last rows.
        return CONTINUOUS_CHUNK_BATCHES * engine.batch_size
    return engine.batch_size


def sample_record(unit: Unit, episode: Episode, seconds: float) -> dict[str, Any]:
    """One line of samples.jsonl: the score, the usage counts and the whole episode."""
    prompt = episode.meta.get("prompt")
    return {
        "item_id": unit.item.id,
        "sample": unit.sample,
        "prompt": prompt,
        **sample_hashes(unit.item, prompt, episode.prompt_ids),
        "completion": episode.response_text,
        **score_episode(episode, unit.item.answer, unit.item.answer_type),
        "prompt_tokens": len(episode.prompt_ids),
        "end": str(episode.end),
        # "length" when the budget cut the response, as a solo completion's finish reason.
        "finish_reason": "length" if episode.end is not None and episode.end.truncated else "stop",
        "seconds": round(seconds, 4),
        **episode_usage(episode),
        "episode": episode.to_dict(),
    }


def _judge(config: EvalConfig, bench: Benchmark, out_dir: Path) -> None:
    """Send rule-rejected answers to the judge; verdicts go to judge.jsonl only. Only
    `math` problems: a `number` problem's rule is the whole answer (a judge would accept
    the echoed expression that rule exists to refuse)."""
    from collabrl.engines.openai_http import OpenAIEngine

    path = out_dir / "judge.jsonl"
    judged = {(r["item_id"], r["sample"]) for r in runs.read_records(path)}
    expressions = {item.id for item in bench.items if item.answer_type == "math"}
    pending = [
        r
        for r in runs.read_records(out_dir / runs.SAMPLES)
        if not r["correct"]
        and r["answer"]
        and r["item_id"] in expressions
        and (r["item_id"], r["sample"]) not in judged
    ]
    if not pending:
        return
    engine = OpenAIEngine(config.judge, model=config.judge_model, api_key=config.engine.api_key)
    try:
        verdicts = judge_answers(engine, [(r["answer"], r["gold"]) for r in pending])
    finally:
        engine.close()
    with runs.RecordWriter(path) as writer:
        for r, v in zip(pending, verdicts, strict=True):
            writer.write(
                {
                    "item_id": r["item_id"],
                    "sample": r["sample"],
                    "answer": r["answer"],
                    "gold": r["gold"],
                    "judge_correct": v.correct,
                    "judge_reply": v.raw,
                }
            )


def read_problems(
    out_dir: Path, bench: Benchmark, n: int
) -> tuple[list[ProblemSamples], list[dict[str, Any]]]:
    """The benchmark's problems that have samples on disk, each with its first `n`, and
    those samples' records."""
    by_item = runs.samples_by_item(out_dir, n)
    problems, kept = [], []
    for item in bench.items:
        samples = by_item.get(item.id, [])
        if not samples:
            continue
        kept.extend(samples)
        answers = [r["answer"] for r in samples]
        # Samples written before strict grading was recorded have none: no strict-match.
        strict = [r.get("strict_correct") for r in samples]
        problems.append(
            ProblemSamples(
                item_id=item.id,
                correct=[bool(r["correct"]) for r in samples],
                f1=[float(r["f1"]) for r in samples],
                answers=answers,
                majority_correct=item.is_correct(majority_answer(answers)),
                strict=None if None in strict else [bool(c) for c in strict],
            )
        )
    if not problems:
        raise UserError(f"{out_dir} has no finished samples", "run the evaluation first")
    return problems, kept


def metrics_of(
    problems: list[ProblemSamples], kept: list[dict[str, Any]], out_dir: Path
) -> dict[str, Any]:
    """metrics.json's content: the problems' summary, the samples' usage and the judge's."""
    metrics: dict[str, Any] = summarize(problems)
    metrics.update(usage_metrics(kept))
    judge_path = out_dir / "judge.jsonl"
    if judge_path.exists():
        metrics["judge"] = _judge_metrics(kept, runs.read_records(judge_path))
    return metrics


def _judge_metrics(samples: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> dict:
    """Accuracy when the judge may overturn rule-based rejections (reported apart)."""
    overturned = {(v["item_id"], v["sample"]) for v in verdicts if v["judge_correct"]}
    correct = [r["correct"] or (r["item_id"], r["sample"]) in overturned for r in samples]
    return {
        "accuracy_with_judge": sum(correct) / len(correct),
        "accuracy_rules_only": sum(r["correct"] for r in samples) / len(samples),
        "judged": len(verdicts),
        "overturned": len(overturned),
    }
