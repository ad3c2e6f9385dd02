"""`collab filter`: RelayLLM's teacher filtering (§3.2.2) and decontamination.

RelayLLM keeps only the training problems its teacher solves: 10 responses per
problem, kept when the pass rate is at least 50%, so that calling the teacher during
training can help. An upper bound (not in the paper) keeps a band instead: with the
policy itself as the "teacher", [0.2, 0.6] keeps the problems it solves sometimes, on
which a group of its rollouts holds both right and wrong answers, so that an accuracy
reward has a group variance to learn from (rSIM's stand-in, docs/results.md).

The teacher answers with the data's prompt (the relay solver prompt for the math sets,
as in the paper); a response is correct when the answer extracted from it (the prompt's
extractors, then the data's fallback) is equivalent to the reference answer. The filter
asks one prompt, not a protocol: a policy that answers under a protocol (rSIM's planner
and step budgets) is measured by `collab eval run --protocol ... --n K` instead.

    config.yaml       the resolved config; a re-run with another experiment is refused
    samples.jsonl     every scored teacher response, appended one chunk at a time
    pass_rates.jsonl  every problem: item_id, pass_rate, passed, k, kept
    rows.jsonl        the kept problems as data rows (`--data F/rows.jsonl` loads them)
    dropped.jsonl     with --decontaminate: the rows dropped and what they matched
    dataset/          rows.jsonl as a `datasets` folder
    stats.json        counts, the pass-rate histogram's numbers, decontamination counts
    stats.png         the same, drawn

Samples are the unit of work. The bounds only read them, so a re-run with another
`--threshold` or `--max-threshold` re-filters without asking the teacher. Problems go
to the teacher in fixed chunks, their calls grouped by sample index (sample s is asked
with seed `seed + s`), so a kill loses at most the chunk in flight. A group partly done
is asked again whole and only its missing samples are kept, so a resumed run samples
what an uninterrupted one does. A call that fails is not written: the problem stays
out (it has fewer than k samples) until a re-run retries it. A run in which every call
failed is refused as a whole (one error; a folder it made is removed).

A problem row over `MAX_PROBLEM_CHARS` characters (data/benchmarks.py) is skipped: never
sent to the teacher nor kept, counted as `oversized` in stats.json and noted by the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl import runs
from collabrl.builders.decontaminate import Decontamination, decontaminate, evaluation_sets
from collabrl.builders.folder import BuildFolder, BuildResult, reasons, summary
from collabrl.builders.plots import Panel
from collabrl.config import (
    MAX_SAMPLES,
    DataColumns,
    EngineConfig,
    SamplingConfig,
    option,
)
from collabrl.data.benchmarks import Benchmark, Fields, Item, load_benchmark
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.engines.endpoints import check_collaborator
from collabrl.engines.reference import STAND_IN_NOTE, is_stand_in
from collabrl.errors import UserError, require
from collabrl.eval.runner import chunk_size
from collabrl.protocols.collaborators import collaborator_pool
from collabrl.rewards.extract import extract_answer
from collabrl.rewards.score import score_answer

if TYPE_CHECKING:
    from collabrl.engines.calls import CallRecord

PASS_RATES = "pass_rates.jsonl"
DROPPED = "dropped.jsonl"


@dataclass
class FilterConfig(DataColumns):
    """RelayLLM's teacher filtering, and decontamination against the evaluation sets."""

    teacher: str | None = option(
        None,
        "Teacher: a model reference (loaded in-process), a `collab serve` or vLLM URL, or "
        "`reference` (a stand-in that answers from the gold answer). Unset: only "
        "--decontaminate.",
    )
    data: str = option(
        "dapo_math_17k", "Training problems: a registered name or a .jsonl/.parquet/folder path."
    )
    limit: int | None = option(None, "Use only the first N problems.")
    out: str | None = option(
        None, "Output folder (default: a new folder under runs/); an existing one is resumed."
    )
    k: int = option(10, "Teacher responses sampled per problem (the paper's 10).")
    threshold: float = option(
        0.5,
        "Keep problems whose pass rate is at least this (the paper's 0.5); a re-run "
        "with another threshold re-filters the saved samples.",
    )
    max_threshold: float | None = option(
        None,
        "Keep only problems whose pass rate is at most this (unset: no upper bound; not "
        "in the paper): with --threshold, a band such as [0.2, 0.6] of problems the model "
        "solves sometimes. A re-run with another bound re-filters the saved samples.",
    )
    decontaminate: bool = option(
        False,
        "First drop rows that overlap a shipped evaluation benchmark (exact or 13-gram).",
    )
    prompt: str | None = option(
        None,
        "Prompt template the teacher answers with (default: the data's own: the relay "
        "solver prompt for the math sets, plain for arith, whose problems ask for \\boxed{}).",
    )
    timeout: float = option(
        600.0, "Seconds one teacher call may take (a local CPU model writes ~15 tokens/s)."
    )
    sampling: SamplingConfig = option(
        SamplingConfig(max_tokens=8192, temperature=1.0),
        "How the teacher samples (the paper's rollout settings; n must stay 1: see k). "
        "Sample s uses seed + s.",
    )
    engine: EngineConfig = option(EngineConfig(), "The teacher's engine.")

    def check(self) -> None:
        """Refuse values no run can use, before any data or model is loaded."""
        if self.teacher is None and not self.decontaminate:
            raise UserError("nothing to do", "pass --teacher MODEL_OR_URL and/or --decontaminate")
        self.sampling.check()
        self.engine.check()
        require("sampling.n", self.sampling.n, self.sampling.n == 1, "1 (set k instead)")
        require("k", self.k, 1 <= self.k <= MAX_SAMPLES, f"between 1 and {MAX_SAMPLES}")
        require("threshold", self.threshold, 0 <= self.threshold <= 1, "in [0, 1]")
        if self.max_threshold is not None:
            ok = self.threshold <= self.max_threshold <= 1  # NaN fails
            require(
                "max_threshold", self.max_threshold, ok, f"in [threshold={self.threshold:g}, 1]"
            )
        ok = 0 < self.timeout < float("inf")  # NaN fails both
        require("timeout", self.timeout, ok, "a finite number of seconds > 0")
        require("limit", self.limit, self.limit is None or self.limit >= 1, "at least 1")
        if self.prompt is not None:
            get_prompt(self.prompt)


# Resources, bookkeeping and choices that only read the saved samples.
RESUMABLE_KEYS = frozenset(
    {"limit", "out", "engine", "timeout", "threshold", "max_threshold", "decontaminate"}
)


def build_filter(
    config: FilterConfig, progress: Callable[[int, int], None] | None = None
) -> BuildResult:
    """Filter (or resume filtering) in the output folder; see the module docstring."""
    config.check()
    if config.teacher is not None:
        check_collaborator(config.teacher, config.engine.api_key)
    bench = load_benchmark(config.data, Fields.of(config), config.limit, keep_oversized=True)
    out = runs.out_folder(config.out, "filter", config.data, config.teacher or "decontaminated")
    folder = BuildFolder(out)
    samples_path = out / runs.SAMPLES
    with runs.run_folder(config, out, RESUMABLE_KEYS, (samples_path, folder.rows_path)):
        items = [item for item in bench.items if not item.oversized]
        skipped, cleaned = len(bench.items) - len(items), None
        if config.decontaminate:
            cleaned = decontaminate(items, evaluation_sets())
            runs.write_records(out / DROPPED, dropped_rows(cleaned))
            items = cleaned.kept
        new, failures, rates = keep_rows(config, bench, items, folder, progress)
        rows = folder.export()
        stats = filter_stats(config, len(bench.items), len(rows), rates, failures, cleaned)
        stats["oversized"] = skipped
        folder.write_stats(stats)
        plot(folder, config, rates, cleaned, stats)
    return BuildResult(out, stats, new)


def keep_rows(
    config: FilterConfig,
    bench: Benchmark,
    items: list[Item],
    folder: BuildFolder,
    progress: Callable[[int, int], None] | None,
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    """Write the rows kept, every item without a teacher; the samples written now, the
    failed calls and the pass rates."""
    if config.teacher is None:
        runs.write_records(folder.rows_path, [data_row(item) for item in items])
        return 0, [], []
    samples_path = folder.path / runs.SAMPLES
    new, failures = sample_teacher(config, bench, items, samples_path, progress)
    if failures and not new:
        # A teacher that answered no call (down, or answering garbage) is an error, not a run.
        raise UserError(
            f"every teacher call failed ({len(failures)}), the first with: "
            f"{failures[0]['reason'].splitlines()[0]}",
            "fix the teacher, then re-run the same command (samples already written are kept)",
        )
    rates = pass_rates(items, runs.read_records(samples_path), config)
    runs.write_records(folder.path / PASS_RATES, rates)
    by_id = {item.id: item for item in items}
    kept = [data_row(by_id[r["item_id"]], r["pass_rate"]) for r in rates if r["kept"]]
    runs.write_records(folder.rows_path, kept)
    return new, failures, rates


def sample_teacher(
    config: FilterConfig,
    bench: Benchmark,
    items: list[Item],
    samples_path: Path,
    progress: Callable[[int, int], None] | None,
) -> tuple[int, list[dict[str, Any]]]:
    """Ask the teacher for every missing sample; return the number written and the
    failed calls (each with its reason)."""
    from collabrl.engines.calls import Call

    done = {(r["item_id"], r["sample"]) for r in runs.read_records(samples_path)}
    todo = sum((item.id, s) not in done for item in items for s in range(config.k))
    if not todo:
        return 0, []
    template = get_prompt(config.prompt or bench.prompt)
    extractors = (*template.extract, *bench.extract_fallback)
    # The teacher is this builder's model: its engine options (API key and served model
    # included) are the builder's own.
    teacher = collaborator_pool([config.teacher], config.timeout, config.engine)
    chunk = chunk_size(config.engine, config.teacher)
    written, failures = 0, []
    with teacher, runs.RecordWriter(samples_path) as out:
        for start in range(0, len(items), chunk):
            members = items[start : start + chunk]
            groups = [s for s in range(config.k) if any((i.id, s) not in done for i in members)]
            if not groups:
                continue
            calls = [Call(1, template.messages(i.problem), i.reference) for i in members]
            # Sample s of every problem is asked with seed + s (its own request each).
            params = [
                SamplingParams.of(config.sampling, seed=config.sampling.seed + s)
                for s in groups
                for _ in calls
            ]
            asked = teacher.ask_each_sync([c for _ in groups for c in calls], params)
            answers = [asked[g * len(calls) : (g + 1) * len(calls)] for g in range(len(groups))]
            for s, group in zip(groups, answers, strict=True):
                for item, record in zip(members, group, strict=True):
                    if (item.id, s) in done:
                        continue
                    if not record.ok:
                        failures.append({"item_id": item.id, "sample": s, "reason": record.error})
                        continue
                    out.write(score(item, s, record, extractors))
                    written += 1
            if progress:
                progress(written + len(failures), todo)
    return written, failures


def score(
    item: Item, sample: int, record: CallRecord, extractors: tuple[str, ...]
) -> dict[str, Any]:
    """One line of samples.jsonl: the response, its extracted answer and its score, as
    `collab eval` records a sample."""
    return {
        "item_id": item.id,
        "sample": sample,
        "text": record.text,
        **score_answer(extract_answer(record.text, extractors), item.answer, item.answer_type),
        "finish_reason": record.finish_reason,
        "completion_tokens": record.completion_tokens,
        "latency_s": round(record.latency_s, 3),
    }


def pass_rates(
    items: list[Item], samples: list[dict[str, Any]], config: FilterConfig
) -> list[dict[str, Any]]:
    """Every problem's pass rate over its first k samples; kept only with all k scored."""
    correct: dict[tuple[str, int], bool] = {
        (r["item_id"], r["sample"]): r["correct"] for r in samples if r["sample"] < config.k
    }
    rates = []
    for item in items:
        scored = [correct[item.id, s] for s in range(config.k) if (item.id, s) in correct]
        rate = sum(scored) / len(scored) if scored else 0.0
        rates.append(
            {
                "item_id": item.id,
                "pass_rate": rate,
                "passed": sum(scored),
                "k": len(scored),
                "kept": len(scored) == config.k and in_band(rate, config),
            }
        )
    return rates


def in_band(rate: float, config: FilterConfig) -> bool:
    """Whether a pass rate is within the bounds kept: [threshold, max_threshold]."""
    upper = 1.0 if config.max_threshold is None else config.max_threshold
    return config.threshold <= rate <= upper


def data_row(item: Item, pass_rate: float | None = None) -> dict[str, Any]:
    """A problem as `load_benchmark` reads it back, with its pass rate when it has one."""
    row: dict[str, Any] = {"id": item.id, "problem": item.problem, "answer": item.answer}
    if item.solution is not None:
        row["solution"] = item.solution
    if pass_rate is not None:
        row["pass_rate"] = pass_rate
    return row


def dropped_rows(cleaned: Decontamination) -> list[dict[str, Any]]:
    """The rows decontamination dropped, each with the evaluation problem it matched."""
    return [
        {**data_row(d.item), "benchmark": d.benchmark, "how": d.how, "eval_id": d.eval_id}
        for d in cleaned.dropped
    ]


def filter_stats(
    config: FilterConfig,
    problems: int,
    kept: int,
    rates: list[dict[str, Any]],
    failures: list[dict[str, Any]],
    cleaned: Decontamination | None,
) -> dict[str, Any]:
    """What the filter did: counts (`dropped` by either step), the pass-rate histogram,
    decontamination counts."""
    stats: dict[str, Any] = {
        "builder": "teacher filtering (RelayLLM §3.2.2)",
        "teacher": config.teacher,
        "data": config.data,
        "problems": problems,
        "kept": kept,
        "dropped": problems - kept,
    }
    if config.teacher is not None:
        histogram = {f"{c}/{config.k}": 0 for c in range(config.k + 1)}
        for r in rates:
            if r["k"] == config.k:
                histogram[f"{r['passed']}/{config.k}"] += 1
        stats |= {
            "k": config.k,
            "threshold": config.threshold,
            "max_threshold": config.max_threshold,
            "below_threshold": sum(
                r["k"] == config.k and r["pass_rate"] < config.threshold for r in rates
            ),
            # Complete and out of the band without being below it.
            "above_max_threshold": sum(
                r["k"] == config.k and not r["kept"] and r["pass_rate"] >= config.threshold
                for r in rates
            ),
            "incomplete": sum(r["k"] < config.k for r in rates),
            "failed_samples": len(failures),
            "failure_reasons": reasons(failures),
            "pass_rate": summary([r["pass_rate"] for r in rates if r["k"] == config.k]),
            "pass_rate_histogram": histogram,
        }
    if cleaned is not None:
        stats["decontamination"] = {
            "dropped": len(cleaned.dropped),
            "per_benchmark": cleaned.counts(),
        }
    if config.teacher is not None and is_stand_in(config.teacher):
        stats["stand_in"] = STAND_IN_NOTE
    return stats


def plot(
    folder: BuildFolder,
    config: FilterConfig,
    rates: list[dict[str, Any]],
    cleaned: Decontamination | None,
    stats: dict[str, Any],
) -> None:
    """stats.png: the pass-rate histogram, and the decontamination bars when used."""
    panels = []
    if config.teacher is not None:
        # One bin per possible pass rate c/k.
        edges = tuple((c - 0.5) / config.k for c in range(config.k + 2))
        values = tuple(r["pass_rate"] for r in rates if r["k"] == config.k)
        panels.append(Panel("teacher pass rate", "pass rate", values, bins=edges))
    if cleaned is not None:
        counts = tuple(
            (name, sum(c.values())) for name, c in cleaned.counts().items() if sum(c.values())
        )
        panels.append(Panel("dropped as contaminated", "benchmark", counts=counts))
    title = f"filter: {stats['kept']} of {stats['problems']} problems kept"
    folder.save_plot(panels, title)
