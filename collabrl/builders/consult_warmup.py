"""`collab build-warmup consult`: a warm-up set for EAPO's call format (this project's).

EAPO's 7B policies write `<agent_calls>` because the training prompt (appendix D)
asks them to; the paper has no warm-up. The embedded SmolLM2-135M does not: under
that prompt it wrote no call in 64 samples on arith, and RL cannot reinforce a call
that is never sampled. This set teaches the whole consult turn first.

Every problem is one unit: the policy samples its own response with `prompt`, and
a generator seeded from the sampling seed and the unit decides, with probability
`call_fraction`, whether the unit is

- a call, two rows. The first ends at `</agent_calls>` (where the consult protocol
  stops to ask): an `<agent_calls>` block asking expert k (drawn from 1..K by the same
  generator) the problem itself, as `format_agent_calls` writes it. The expert
  (`--expert`) answers it, and the second row reads that `<agent_returns>` block and
  writes the "Answer: xxx" line of the expert's answer. The returns are in the second
  row's prompt, so they carry no loss: the policy learns to read experts, not to
  predict them (a stand-in expert's text is the gold answer). A call the expert does
  not answer gives no rows.
- an answer, one row: the policy's own response, ending in the "Answer: xxx" line
  EAPO's format reward asks for (appended from the response's extracted answer when
  it does not end in one). A response with no extracted answer, or cut by the token
  limit, gives no row.

The rows are text prompt–completion pairs: the prompt is the consult protocol's own
open-mode training prompt (`training_prompt(K, query_budget)`) rendered with the
policy's chat template, then what the episode holds before the completion. A chat row
could not hold the second row, which continues the assistant turn the returns
interrupt; so SFT trains on exactly the token context `collab train eapo` samples in.
Every unit is sampled, call or not: a unit's response and its call decision then
depend on neither `call_fraction` nor resuming.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collabrl.builders.folder import BuildFolder, BuildResult, reasons, summary
from collabrl.builders.plots import Panel
from collabrl.builders.policy import open_build, sample_into
from collabrl.builders.sampling import MakeRow
from collabrl.config import (
    MAX_SAMPLES,
    DataColumns,
    EngineConfig,
    SamplingConfig,
    option,
)
from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines.base import Engine, SamplingParams
from collabrl.engines.endpoints import check_collaborator
from collabrl.engines.reference import stand_in_accuracy
from collabrl.episode import EndReason, Episode
from collabrl.errors import require
from collabrl.protocols.base import Policy
from collabrl.protocols.collaborators import collaborator_pool
from collabrl.protocols.consult import (
    ConsultConfig,
    expert_messages,
    returns_pieces,
    training_prompt,
)
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
from collabrl.rewards.extract import answer_line, extract_answer

if TYPE_CHECKING:  # the pool brings in the HTTP client: not needed to check a config
    from collabrl.engines.pool import ExpertPool

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
    expert: str = option(
        "reference",
        "Who answers the rows' calls (every expert id): a model reference, a URL, or the "
        "reference stand-in (reference, reference@P).",
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
        stand_in_accuracy(self.expert)  # `reference@2` is refused here; a URL is tried by the build

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
        with _expert_pool(config) as pool:
            maker = _row_maker(config, pool)
            new = sample_into(folder, config, template, units, maker, progress, engine)
        rows = folder.export(training_rows)
        stats = consult_stats(config, rows, folder.rejected(), len(units))
        folder.write_stats(stats)
        _plot(folder, rows, stats)
    return BuildResult(folder.path, stats, new)


def _expert_pool(config: ConsultWarmupConfig) -> ExpertPool:
    """Every expert id of the prompt served by `config.expert` (a URL that does not answer
    or a model that does not resolve is refused before any sampling)."""
    check_collaborator(config.expert, config.engine.api_key)
    return collaborator_pool(
        [config.expert], _CONSULT.expert_timeout, config.engine, num_experts=config.num_experts
    )


def _row_maker(config: ConsultWarmupConfig, pool: ExpertPool) -> Callable[[SoloProtocol], MakeRow]:
    """Rows are rendered with the policy's chat template: it needs a tokenizer."""
    prompt = config.row_prompt()

    def for_policy(solo: SoloProtocol) -> MakeRow:
        solo.policy.require_tokenizer("consult warm-up")
        return functools.partial(_make_rows, config, prompt, solo.policy, pool)

    return for_policy


def _make_rows(
    config: ConsultWarmupConfig,
    prompt: PromptTemplate,
    policy: Policy,
    pool: ExpertPool,
    unit: Unit,
    episode: Episode,
) -> dict[str, Any] | str:
    """The unit's row (a call's holds its read row) from its decision and response, or
    why it gives none."""
    assert policy.tokenizer is not None  # _row_maker required it
    start = policy.tokenizer.decode(policy.prompt_ids(prompt.messages(unit.item.problem)))
    expert_id = decide(config, unit)
    if expert_id is None:
        try:
            completion = answer_completion(episode)
        except ValueError as err:
            return str(err)
        return _row(policy, unit, start, completion, "answer", episode, expert_id)
    call = call_completion(unit.item.problem, expert_id)
    try:
        block, answer = ask_expert(config, prompt, pool, unit, expert_id)
    except ValueError as err:
        return str(err)
    read = _row(policy, unit, start + call + block, f"Answer: {answer}", "read", episode, expert_id)
    return {**_row(policy, unit, start, call, "call", episode, expert_id), "read": read}


def training_rows(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The training rows one line of rows.jsonl holds: a call's line, the call and its
    read row (with the unit's key); any other line, itself."""
    if line.get("read") is None:
        return [line]
    key = {"item_id": line["item_id"], "sample": line["sample"]}
    return [{k: v for k, v in line.items() if k != "read"}, {**line["read"], **key}]


def ask_expert(
    config: ConsultWarmupConfig,
    prompt: PromptTemplate,
    pool: ExpertPool,
    unit: Unit,
    expert_id: int,
) -> tuple[str, str]:
    """The `<agent_returns>` block answering the unit's call, as the protocol writes it,
    and the expert's answer, read as the protocol reads the policy's (`prompt`'s
    extractors).

    Greedy, with the consult protocol's expert token budget. Raises ValueError with the
    reason when there is no one-line answer to read.
    """
    item = unit.item
    call = (expert_id, expert_messages(item.problem), item.reference)
    params = SamplingParams(
        max_tokens=_CONSULT.expert_max_tokens, temperature=0.0, seed=config.sampling.seed
    )
    (record,) = pool.ask_each_sync([call], [params])
    if not record.ok:
        raise ValueError(f"expert unavailable: {record.error}")
    answer = extract_answer(record.text, prompt.extract)
    if not answer or "\n" in answer:
        raise ValueError("expert gave no one-line answer")
    return "".join(returns_pieces([(expert_id, record.text)])), answer


def _row(
    policy: Policy,
    unit: Unit,
    prompt: str,
    completion: str,
    kind: str,
    episode: Episode,
    expert_id: int | None,
) -> dict[str, Any]:
    """One text row and its bookkeeping: token counts (what a trainer's max_length must
    hold: the consult prompt alone is ~620 SmolLM2 tokens) and the answer's score."""
    answer = answer_line(completion) if kind != "call" else None
    return {
        "prompt": prompt,
        "completion": completion,
        "kind": kind,
        "expert_id": expert_id,
        "answer": answer,
        "correct": None if answer is None else unit.item.is_correct(answer),
        "prompt_tokens": len(policy.encode(prompt)),
        "completion_tokens": len(policy.encode(completion)),
        "response_tokens": len(episode.response_ids),
        "end": str(episode.end),
    }


def consult_stats(
    config: ConsultWarmupConfig,
    rows: list[dict[str, Any]],
    rejected: list[dict[str, Any]],
    units: int,
) -> dict[str, Any]:
    """What the set holds: call, read and answer rows, rejections, experts asked, lengths."""
    kinds = {k: [r for r in rows if r["kind"] == k] for k in ("call", "read", "answer")}
    units_kept = kinds["call"] + kinds["answer"]
    experts: dict[str, int] = {}
    for r in kinds["call"]:
        experts[str(r["expert_id"])] = experts.get(str(r["expert_id"]), 0) + 1
    return {
        "builder": "consult warm-up (this project's; EAPO has none)",
        "model": config.model,
        "data": config.data,
        "expert": config.expert,
        "units": units,
        "rows": len(rows),
        "call_rows": len(kinds["call"]),
        "read_rows": len(kinds["read"]),
        "answer_rows": len(kinds["answer"]),
        # Units that call, of those that gave rows.
        "call_share": round(len(kinds["call"]) / len(units_kept), 4) if units_kept else 0.0,
        "call_fraction": config.call_fraction,
        "rejected": reasons(rejected),
        "experts_called": dict(sorted(experts.items())),
        "answers_correct": sum(bool(r["correct"]) for r in kinds["answer"]),
        "expert_answers_correct": sum(bool(r["correct"]) for r in kinds["read"]),
        **{f"{k}_completion_tokens": summary(_tokens(kinds[k])) for k in kinds},
        "response_tokens": summary([r["response_tokens"] for r in rows]),
        "prompt_tokens": summary([r["prompt_tokens"] for r in rows]),
        "row_tokens": summary([r["prompt_tokens"] + r["completion_tokens"] for r in rows]),
    }


def _tokens(rows: list[dict[str, Any]]) -> list[float]:
    return [r["completion_tokens"] for r in rows]


def _plot(folder: BuildFolder, rows: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    rejected = sum(stats["rejected"].values())
    folder.save_plot(
        [
            Panel(
                "units",
                "became",
                counts=(
                    ("calls", stats["call_rows"]),
                    ("answers", stats["answer_rows"]),
                    ("rejected", rejected),
                ),
            ),
            Panel(
                "answers after returns",
                "tokens",
                tuple(_tokens([r for r in rows if r["kind"] == "read"])),
            ),
            Panel(
                "own answers",
                "tokens",
                tuple(_tokens([r for r in rows if r["kind"] == "answer"])),
            ),
            Panel("units rejected", "reason", counts=tuple(stats["rejected"].items())),
        ],
        f"consult warm-up: {stats['call_rows']} calls, {stats['answer_rows']} answers "
        f"from {stats['units']} problems",
    )
