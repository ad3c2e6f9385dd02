"""`collab build-warmup consult`: a warm-up set for EAPO's call format (this project's).

EAPO's 7B policies write `<agent_calls>` because the training prompt (appendix D)
asks them to; the paper has no warm-up. The embedded SmolLM2-135M does not: under
that prompt it wrote no call in 64 samples on arith, and RL cannot reinforce a call
that is never sampled. This set teaches the whole consult turn first.

Every problem is one unit: the policy samples its own response with `prompt`, and the
unit becomes one of three outcomes, the three a consult episode of training can take:

- an accepted call, two rows. The first ends at `</agent_calls>` (where the consult
  protocol stops to ask): an `<agent_calls>` block asking expert k (drawn from 1..K)
  the problem itself, as `format_agent_calls` writes it. The expert (`--expert`)
  answers it, and the second row reads that `<agent_returns>` block and writes the
  "Answer: xxx" line of the expert's answer. The returns are in the second row's
  prompt, so they carry no loss: the policy learns to read experts, not to predict
  them. A call the expert does not answer gives no rows.
- a refused call, two rows: the same call, then returns that read "unavailable",
  exactly as the protocol writes a reply that ρ refused, and the policy going on
  alone to a right answer: its own response where its answer is right, else the
  item's worked solution (where the data has one) and its "Answer:" line. The expert
  is not asked: a refused reply shows none of its text.
- an answer, one row: the policy's own response, ending in the "Answer: xxx" line
  EAPO's format reward asks for (appended from the response's extracted answer when
  it does not end in one). A response with no extracted answer, or cut by the token
  limit, gives no row.

Which units call is `call_when`: `random`, a share `call_fraction` drawn per unit, or
`fails_alone`, exactly the units whose own response gives no right answer, so the
policy is taught to call where it needs help and to answer where it does not. A share
`refused_fraction` of the calls is refused. Every draw comes from a generator seeded
from the sampling seed and the unit.

The rows are text prompt–completion pairs: the prompt is the consult protocol's own
open-mode training prompt (`training_prompt(K, query_budget)`) rendered with the
policy's chat template, then what the episode holds before the completion. A chat row
could not hold the second row, which continues the assistant turn the returns
interrupt; so SFT trains on exactly the token context `collab train eapo` samples in.
Every unit is sampled, call or not: a unit's response and its draws then depend on
neither the shares nor resuming.
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
from collabrl.data.benchmarks import Item
from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines.base import Engine, SamplingParams
from collabrl.engines.endpoints import check_collaborator
from collabrl.engines.reference import REFERENCE, clean_solution, stand_in_accuracy
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
# How `call_when` picks the units that call.
CALL_RULES = ("random", "fails_alone")


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
    call_when: str = option(
        "random",
        "Which problems call: random, a share call_fraction drawn per problem (the default, "
        "so that earlier builds keep their meaning); fails_alone, exactly the problems whose "
        "own sampled answer is not right, teaching to call where the policy needs help and "
        "to answer alone where it does not (call_fraction unused).",
    )
    call_fraction: float = option(
        0.5,
        "call_when random: share of problems whose rows are an expert call (drawn per "
        "problem), in [0, 1].",
    )
    refused_fraction: float = option(
        0.0,
        "Share of the calls whose reply reads unavailable, as the consult protocol writes "
        "an answer rho refused (drawn per problem), in [0, 1]: their rows teach going on "
        "alone to a right answer after a refusal. 0 (the default) keeps earlier builds' rows.",
    )
    num_experts: int = option(
        _CONSULT.num_experts, "K of the consult prompt: calls ask an expert in 1..K."
    )
    query_budget: int = option(
        _CONSULT.query_budget, "Query budget the consult prompt states (as consult.query_budget)."
    )
    expert: str = option(
        REFERENCE,
        "Who answers the rows' calls (every expert id): a model reference, a URL, or a "
        "reference stand-in (reference, reference@P, reference-solution@P).",
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
        require("call_when", self.call_when, self.call_when in CALL_RULES, " or ".join(CALL_RULES))
        for key in ("call_fraction", "refused_fraction"):
            fraction = getattr(self, key)
            require(key, fraction, 0.0 <= fraction <= 1.0, "in [0, 1]")
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


@dataclass(frozen=True)
class Consult:
    """A unit's call: the expert it asks, and whether the reply reads unavailable."""

    expert_id: int
    refused: bool


def decide(config: ConsultWarmupConfig, unit: Unit, solved: bool) -> Consult | None:
    """The call a unit's rows make, or None when its row is the answer alone; `solved`,
    whether the policy's own response gives a right answer, is what `fails_alone` reads.

    Drawn by a generator of the seed and the unit alone: stable on resume, and
    independent of chunking and of the other units.
    """
    rng = random.Random(f"consult-warmup:{config.sampling.seed}:{unit.item.id}:{unit.sample}")
    # Drawn under either rule, so that the expert and refusal draws after it are the same.
    draw = rng.random()
    calls = not solved if config.call_when == "fails_alone" else draw < config.call_fraction
    if not calls:
        return None
    # With refused_fraction 0 the refusal draw never refuses: earlier builds' rows stand.
    return Consult(rng.randint(1, config.num_experts), rng.random() < config.refused_fraction)


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
    return with_answer_line(text, answer)


def with_answer_line(text: str, answer: str) -> str:
    """`text` (none at all, or lines) then the line "Answer: `answer`".

    Raises ValueError when the line does not read back as `answer`.
    """
    completion = f"{text}\nAnswer: {answer}" if text else f"Answer: {answer}"
    # A multi-line answer (a boxed matrix) would leave its tail after the answer line.
    if "\n" in answer or answer_line(completion) != answer:
        raise ValueError("answer does not fit an answer line")
    return completion


def solved_alone(item: Item, episode: Episode) -> bool:
    """Whether the policy's own response gives an answer row with a right answer."""
    try:
        return item.is_correct(answer_line(answer_completion(episode)))
    except ValueError:
        return False


def worked_completion(item: Item) -> str:
    """The item's worked solution, where the data has one, ending in its "Answer:" line.

    Raises ValueError when the answer does not fit an answer line.
    """
    return with_answer_line(clean_solution(item.solution or ""), item.answer)


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
    """The unit's row (a call's holds the row after its returns) from its draws and
    response, or why it gives none."""
    assert policy.tokenizer is not None  # _row_maker required it
    start = policy.tokenizer.decode(policy.prompt_ids(prompt.messages(unit.item.problem)))
    solved = solved_alone(unit.item, episode)
    consult = decide(config, unit, solved)
    try:
        if consult is None:
            completion = answer_completion(episode)
            return _row(policy, unit, start, completion, "answer", episode, None, own=True)
        expert_id = consult.expert_id
        call = call_completion(unit.item.problem, expert_id)
        if consult.refused:
            block = "".join(returns_pieces([(expert_id, None)]))
            after = refused_row(policy, unit, start + call + block, episode, solved, expert_id)
        else:
            block, answer = ask_expert(config, prompt, pool, unit, expert_id)
            completion = f"Answer: {answer}"
            after = _row(policy, unit, start + call + block, completion, "read", episode, expert_id)
    except ValueError as err:
        return str(err)
    return {**_row(policy, unit, start, call, "call", episode, expert_id), "read": after}


def refused_row(
    policy: Policy, unit: Unit, prompt: str, episode: Episode, solved: bool, expert_id: int
) -> dict[str, Any]:
    """The row after a refused reply: the policy going on alone to a right answer.

    Its own response where that is right; otherwise the item's worked solution, since
    SFT on a wrong answer teaches the wrong answer, and dropping the row would leave
    `fails_alone` (whose calls are exactly the problems the policy gets wrong) with no
    refused row at all. Raises ValueError when neither fits an answer line.
    """
    completion = answer_completion(episode) if solved else worked_completion(unit.item)
    return _row(policy, unit, prompt, completion, "refused", episode, expert_id, own=solved)


def training_rows(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The training rows one line of rows.jsonl holds: a call's line, the call and the
    row after its returns (read or refused, with the unit's key); any other line, itself."""
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
    own: bool = False,
) -> dict[str, Any]:
    """One text row and its bookkeeping: token counts (what a trainer's max_length must
    hold: the consult prompt alone is ~620 SmolLM2 tokens), the answer's score, and
    whether the completion is the policy's own sampled response (`own`)."""
    answer = answer_line(completion) if kind != "call" else None
    return {
        "prompt": prompt,
        "completion": completion,
        "kind": kind,
        "expert_id": expert_id,
        "answer": answer,
        "correct": None if answer is None else unit.item.is_correct(answer),
        "own": own,
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
    """What the set holds: rows of each outcome (a call's read or refused row, or the
    answer alone), rejections, experts asked, lengths."""
    kinds = {k: [r for r in rows if r["kind"] == k] for k in ("call", "read", "refused", "answer")}
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
        "refused_rows": len(kinds["refused"]),
        # Refused rows that are the policy's own response; the rest, the item's worked solution.
        "refused_own_rows": sum(bool(r["own"]) for r in kinds["refused"]),
        "answer_rows": len(kinds["answer"]),
        # Units that call, of those that gave rows.
        "call_share": round(len(kinds["call"]) / len(units_kept), 4) if units_kept else 0.0,
        "call_when": config.call_when,
        "call_fraction": config.call_fraction,
        "refused_fraction": config.refused_fraction,
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
                    ("accepted calls", stats["read_rows"]),
                    ("refused calls", stats["refused_rows"]),
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
        f"consult warm-up: {stats['read_rows']} accepted and {stats['refused_rows']} refused "
        f"calls, {stats['answer_rows']} answers from {stats['units']} problems",
    )
