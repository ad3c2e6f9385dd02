"""`collab build-warmup consult`: a warm-up set for EAPO's call format (this project's).

EAPO's 7B policies write `<agent_calls>` because the training prompt (appendix D)
asks them to; the paper has no warm-up. The embedded SmolLM2-135M does not: under
that prompt it wrote no call in 64 samples on arith, and RL cannot reinforce a call
that is never sampled. This set teaches the format first.

Every problem is one unit: the policy samples its own response with `prompt`, and
a generator seeded from the sampling seed and the unit decides, with probability
`call_fraction`, whether the unit's row is

- a call: the completion is an `<agent_calls>` block asking expert k (drawn from
  1..K by the same generator) the problem itself, as `format_agent_calls` writes it
  (the consult protocol stops at `</agent_calls>`, so that is where the turn ends);
- an answer: the policy's own response, ending in the "Answer: xxx" line EAPO's
  format reward asks for (appended from the response's extracted answer when it does
  not end in one). A response with no extracted answer, or cut by the token limit,
  gives no row.

Every row's prompt is the consult protocol's own open-mode training prompt for the
problem (`training_prompt(K, query_budget)`), so SFT teaches the behaviour on exactly
the prompt `collab train eapo` samples with. Every unit is sampled, call or not: a
unit's response and its call decision then depend on neither `call_fraction` nor
resuming.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collabrl.builders.folder import BuildFolder, BuildResult, reasons, sft_row, summary
from collabrl.builders.plots import Panel
from collabrl.builders.policy import open_build, sample_into
from collabrl.builders.sampling import MakeRow
from collabrl.config import MAX_SAMPLES, DataColumns, EngineConfig, SamplingConfig, option
from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines.base import Engine
from collabrl.episode import EndReason, Episode
from collabrl.errors import require
from collabrl.protocols.base import Policy
from collabrl.protocols.consult import ConsultConfig, training_prompt
from collabrl.protocols.parsing import (
    AGENT_CALLS_CLOSE,
    AGENT_CALLS_OPEN,
    AGENT_RETURNS_OPEN,
    ExpertQuery,
    format_agent_calls,
)
from collabrl.protocols.sampling import Unit, units_of
from collabrl.protocols.solo import SoloProtocol
from collabrl.rewards.eapo import format_ok
from collabrl.rewards.extract import answer_line
from collabrl.rewards.verify import is_equivalent

_CONSULT = ConsultConfig()


@dataclass
class ConsultWarmupConfig(DataColumns):
    """A warm-up set for EAPO's consult format: expert calls and the policy's own answers."""

    model: str = option(
        "smollm2-135m", "The policy whose own answers are the answer rows: reference or URL."
    )
    data: str = option(
        "arith_train", "Training problems: a registered name or a .jsonl/.parquet/folder path."
    )
    limit: int | None = option(None, "Use only the first N problems.")
    out: str | None = option(
        None, "Output folder (default: a new folder under runs/); an existing one is resumed."
    )
    prompt: str = option(
        "plain",
        "Template the policy samples its own answers with (the rows' prompt is always the "
        "consult training prompt).",
    )
    call_fraction: float = option(
        0.5, "Share of problems whose row is an expert call (drawn per problem), in [0, 1]."
    )
    num_experts: int = option(
        _CONSULT.num_experts, "K of the consult prompt: calls ask an expert in 1..K."
    )
    query_budget: int = option(
        _CONSULT.query_budget, "Query budget the consult prompt states (as consult.query_budget)."
    )
    tokenizer: str | None = option(None, "Local tokenizer of a policy served at a URL.")
    sampling: SamplingConfig = option(
        SamplingConfig(max_tokens=1024, temperature=1.0),
        "How the policy's answers are sampled (seed: also the call decisions' seed).",
    )
    engine: EngineConfig = option(EngineConfig(), "The policy's engine.")

    def check(self) -> None:
        """Refuse values no build can use, before any data or model is loaded."""
        self.sampling.check()
        self.engine.check()
        fraction = self.call_fraction
        require("call_fraction", fraction, 0.0 <= fraction <= 1.0, "in [0, 1]")
        # The prompt lists every expert id: this keeps it a few kilobytes.
        ok = 1 <= self.num_experts <= MAX_SAMPLES
        require("num_experts", self.num_experts, ok, f"between 1 and {MAX_SAMPLES}")
        require("query_budget", self.query_budget, self.query_budget >= 1, "at least 1")
        get_prompt(self.prompt)

    def row_prompt(self) -> PromptTemplate:
        """The consult protocol's open-mode prompt, which every row is asked with."""
        return training_prompt(self.num_experts, self.query_budget)


# Resources and bookkeeping: changing them keeps the rows' meaning.
RESUMABLE_KEYS = frozenset({"limit", "out", "engine"})


def decide(config: ConsultWarmupConfig, unit: Unit) -> int | None:
    """The expert a unit's row calls, or None when its row is the answer.

    Drawn by a generator of the seed and the unit alone: stable on resume, and
    independent of chunking and of the other units.
    """
    rng = random.Random(f"consult-warmup:{config.sampling.seed}:{unit.item.id}:{unit.sample}")
    if rng.random() < config.call_fraction:
        return rng.randint(1, config.num_experts)
    return None


def call_completion(problem: str, expert_id: int) -> str:
    """The call that asks expert `expert_id` the problem itself."""
    return format_agent_calls([ExpertQuery(expert_id, problem.strip())])


def answer_completion(episode: Episode) -> str:
    """The policy's response ending in an "Answer: xxx" line.

    Raises ValueError with the reason when the response gives no answer row.
    """
    if episode.end is EndReason.LENGTH:
        raise ValueError("cut by max_tokens")
    text = episode.response_text.strip()
    if any(tag in text for tag in (AGENT_CALLS_OPEN, AGENT_CALLS_CLOSE, AGENT_RETURNS_OPEN)):
        raise ValueError("already holds a consult tag")  # unanswered calls would be taught
    answer = (episode.answer or "").strip()
    if not answer:
        raise ValueError("no extracted answer")
    if format_ok(text):
        return text
    completion = f"{text}\nAnswer: {answer}"
    # A multi-line answer (a boxed matrix) would leave its tail after the answer line.
    if "\n" in answer or answer_line(completion) != answer:
        raise ValueError("answer does not fit an answer line")
    return completion


def build_consult_warmup(
    config: ConsultWarmupConfig,
    progress: Callable[[int, int], None] | None = None,
    engine: Engine | None = None,
) -> BuildResult:
    """Build (or resume) the warm-up set in its folder; see the module docstring."""
    with open_build(config, "warmup-consult", RESUMABLE_KEYS, engine) as (bench, folder):
        units = units_of(bench.items, 1)
        template = get_prompt(config.prompt)
        new = sample_into(folder, config, template, units, _row_maker(config), progress, engine)
        rows = folder.export()
        stats = consult_stats(config, rows, folder.rejected(), len(units))
        folder.write_stats(stats)
        _plot(folder, rows, stats)
    return BuildResult(folder.path, stats, new)


def _row_maker(config: ConsultWarmupConfig) -> Callable[[SoloProtocol], MakeRow]:
    """Rows count their tokens with the policy's tokenizer, when it has one."""
    prompt = config.row_prompt()

    def for_policy(solo: SoloProtocol) -> MakeRow:
        return functools.partial(_make_row, config, prompt, solo.policy)

    return for_policy


def _make_row(
    config: ConsultWarmupConfig,
    prompt: PromptTemplate,
    policy: Policy,
    unit: Unit,
    episode: Episode,
) -> dict[str, Any] | str:
    """A row from the unit's decision and response, or why it gives none."""
    expert_id = decide(config, unit)
    answer = None
    if expert_id is not None:
        completion = call_completion(unit.item.problem, expert_id)
    else:
        try:
            completion = answer_completion(episode)
        except ValueError as err:
            return str(err)
        answer = answer_line(completion)
    messages = prompt.messages(unit.item.problem)
    counted = policy.tokenizer is not None
    return sft_row(
        messages,
        completion,
        kind="answer" if expert_id is None else "call",
        expert_id=expert_id,
        answer=answer,
        correct=None if answer is None else is_equivalent(answer, unit.item.answer),
        # What a trainer's max_length must hold: the rows' prompt is long (~620 SmolLM2 tokens).
        prompt_tokens=len(policy.prompt_ids(messages)) if counted else None,
        completion_tokens=len(policy.encode(completion)) if counted else None,
        response_tokens=len(episode.response_ids),
        end=str(episode.end),
    )


def consult_stats(
    config: ConsultWarmupConfig,
    rows: list[dict[str, Any]],
    rejected: list[dict[str, Any]],
    units: int,
) -> dict[str, Any]:
    """What the set holds: call and answer rows, rejections, experts asked, lengths."""
    calls = [r for r in rows if r["kind"] == "call"]
    answers = [r for r in rows if r["kind"] == "answer"]
    experts: dict[str, int] = {}
    for r in calls:
        experts[str(r["expert_id"])] = experts.get(str(r["expert_id"]), 0) + 1
    return {
        "builder": "consult warm-up (this project's; EAPO has none)",
        "model": config.model,
        "data": config.data,
        "units": units,
        "rows": len(rows),
        "call_rows": len(calls),
        "answer_rows": len(answers),
        "call_share": round(len(calls) / len(rows), 4) if rows else 0.0,
        "call_fraction": config.call_fraction,
        "rejected": reasons(rejected),
        "experts_called": dict(sorted(experts.items())),
        "answers_correct": sum(bool(r["correct"]) for r in answers),
        "call_completion_tokens": summary(_counted(calls, "completion_tokens")),
        "answer_completion_tokens": summary(_counted(answers, "completion_tokens")),
        "response_tokens": summary([r["response_tokens"] for r in rows]),
        "prompt_tokens": summary(_counted(rows, "prompt_tokens")),
        "row_tokens": summary(
            [r["prompt_tokens"] + r["completion_tokens"] for r in rows if r["prompt_tokens"]]
        ),
    }


def _counted(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if r[key] is not None]


def _plot(folder: BuildFolder, rows: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    rejected = sum(stats["rejected"].values())
    folder.save_plot(
        [
            Panel(
                "units",
                "became",
                counts=(
                    ("call rows", stats["call_rows"]),
                    ("answer rows", stats["answer_rows"]),
                    ("rejected", rejected),
                ),
            ),
            Panel(
                "call completions",
                "tokens",
                tuple(_counted([r for r in rows if r["kind"] == "call"], "completion_tokens")),
            ),
            Panel(
                "answer completions",
                "tokens",
                tuple(_counted([r for r in rows if r["kind"] == "answer"], "completion_tokens")),
            ),
            Panel("answers rejected", "reason", counts=tuple(stats["rejected"].items())),
        ],
        f"consult warm-up: {stats['call_rows']} calls, {stats['answer_rows']} answers "
        f"from {stats['units']} problems",
    )
