"""`collab build-warmup relay`: RelayLLM's warm-up set (§3.1).

The policy answers training problems with the relay solver prompt; into each of its
own responses `<call>n</call>` is inserted at random *token* indices t (not at
sentence boundaries: the model should learn to call at any point of a reasoning
gap), with n = d·10^k, d in 1..9, k in 0..3, clipped to the L_rem tokens left after t
(the paper's rule; `clip_n=false` writes n as drawn, see the option).
The tokens after the command stay the policy's own: the paper accepts that mismatch
with inference (where the teacher writes them), because the warm-up only has to
teach the command's syntax, without shifting the policy's distribution.

An insertion point is kept only when the command, in the completion as a trainer
tokenizes it, is exactly the ids the policy emits when it writes the command: a
command whose first or last token merges with its neighbours (`</call>.` → `>.`) or
an index that splits a UTF-8 character would teach ids the relay protocol, which
stops on `</call>`, never sees. Such points are redrawn and counted in stats.json.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collabrl.builders.folder import BuildFolder, BuildResult, reasons, sft_row, summary
from collabrl.builders.plots import Panel
from collabrl.builders.policy import open_build, sample_into
from collabrl.builders.sampling import MakeRow
from collabrl.config import MAX_SAMPLES, DataColumns, EngineConfig, SamplingConfig, option
from collabrl.data.prompts import get_prompt
from collabrl.engines import is_url
from collabrl.engines.base import Engine
from collabrl.episode import Episode
from collabrl.errors import UserError, require
from collabrl.protocols.parsing import CALL_CLOSE, CALL_OPEN, format_relay_call
from collabrl.protocols.sampling import Unit, units_of
from collabrl.protocols.solo import SoloProtocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Redraws of one insertion point before the response is given up.
MAX_TRIES = 32


@dataclass
class RelayWarmupConfig(DataColumns):
    """RelayLLM's warm-up set: the policy's own responses with call commands inserted."""

    model: str = option(
        "smollm2-135m", "The policy whose own samples are the base sequences: reference or URL."
    )
    data: str = option(
        "dapo_math_17k", "Training problems: a registered name or a .jsonl/.parquet/folder path."
    )
    limit: int | None = option(None, "Use only the first N problems.")
    out: str | None = option(
        None, "Output folder (default: a new folder under runs/); an existing one is resumed."
    )
    prompt: str = option("relay", "Solver prompt template the policy answers with.")
    responses_per_problem: int = option(1, "Responses sampled per problem (one row each).")
    insertions: int = option(1, "Call commands inserted into each response.")
    max_exponent: int = option(3, "n = d·10^k with k in 0..max_exponent (the paper's 3).")
    clip_n: bool = option(
        True,
        "Clip each n to the L_rem response tokens after the command (the paper's §3.1). "
        "On short responses that caps n at a few tokens, so the warm-up never writes the "
        "large n a hard problem needs; false writes n as drawn (up to 9·10^max_exponent).",
    )
    tokenizer: str | None = option(
        None, "Local tokenizer of a policy served at a URL (insertions are token indices)."
    )
    sampling: SamplingConfig = option(
        SamplingConfig(max_tokens=1024, temperature=1.0),
        "How the base responses are sampled (seed: also the insertion points' seed).",
    )
    engine: EngineConfig = option(EngineConfig(), "The policy's engine.")

    def check(self) -> None:
        """Refuse values no build can use, before any data or model is loaded."""
        self.sampling.check()
        self.engine.check()
        per_problem = self.responses_per_problem
        ok = 1 <= per_problem <= MAX_SAMPLES
        require("responses_per_problem", per_problem, ok, f"between 1 and {MAX_SAMPLES}")
        # Each command goes before its own response token: more cannot fit any response.
        ok = 1 <= self.insertions <= self.sampling.max_tokens
        must = f"between 1 and sampling.max_tokens ({self.sampling.max_tokens})"
        require("insertions", self.insertions, ok, must)
        require("max_exponent", self.max_exponent, 0 <= self.max_exponent <= 6, "in 0..6")
        get_prompt(self.prompt)
        if is_url(self.model) and self.tokenizer is None:
            # Insertion points are token indices, and a server's text has no ids of ours.
            raise UserError(
                f"the relay warm-up of a policy at a URL ({self.model}) needs its tokenizer",
                "pass --tokenizer with a local reference of the same model",
            )


# Resources and bookkeeping: changing them keeps the rows' meaning.
RESUMABLE_KEYS = frozenset({"limit", "out", "engine"})


@dataclass(frozen=True)
class Insertion:
    """One command put into a response."""

    index: int  # token index t in the response: the command goes before token t
    n_sampled: int  # d·10^k as drawn
    n: int  # the n written in the command: min(n_sampled, L_rem), or n_sampled unclipped
    remaining: int  # L_rem, the response tokens from t on


def draw_n(rng: random.Random, max_exponent: int) -> int:
    """n_sample = d·10^k, d uniform in 1..9, k uniform in 0..max_exponent."""
    return rng.randint(1, 9) * 10 ** rng.randint(0, max_exponent)


def render(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], insertions: list[Insertion]
) -> tuple[str, list[str]]:
    """The completion text, and the text before each command (insertions sorted by index)."""
    pieces: list[str] = []
    befores: list[str] = []
    start = 0
    for ins in insertions:
        pieces.append(tokenizer.decode(ids[start : ins.index]))
        befores.append("".join(pieces))
        pieces.append(format_relay_call(ins.n))
        start = ins.index
    pieces.append(tokenizer.decode(ids[start:]))
    return "".join(pieces), befores


def command_problem(
    tokenizer: PreTrainedTokenizerBase, full_ids: list[int], before: str, command: str
) -> str | None:
    """Why a command in a completion would not be trained as the ids the policy emits
    when it writes it; None when it would."""
    head = tokenizer(before, add_special_tokens=False)["input_ids"]
    own = tokenizer(command, add_special_tokens=False)["input_ids"]
    if full_ids[: len(head)] != head:
        return "merges with the text before"
    if full_ids[len(head) : len(head) + len(own)] != own:
        return "merges with the text after"
    return None


def splits_character(tokenizer: PreTrainedTokenizerBase, ids: list[int], index: int) -> bool:
    """Whether cutting the ids at `index` cuts a character (a byte-level BPE can)."""
    return tokenizer.decode(ids[:index]) + tokenizer.decode(ids[index:]) != tokenizer.decode(ids)


def insert_calls(
    tokenizer: PreTrainedTokenizerBase,
    ids: list[int],
    count: int,
    rng: random.Random,
    max_exponent: int,
    clip: bool = True,
) -> tuple[str, list[Insertion], list[str]]:
    """Insert `count` commands at distinct random token indices of a response.

    Returns the completion, the insertions, and why each redrawn point was. Raises
    ValueError when no clean point was found within MAX_TRIES draws per command.
    """
    if count > len(ids):
        raise ValueError(f"{len(ids)} tokens cannot take {count} commands")
    chosen: list[Insertion] = []
    redrawn: list[str] = []
    for _ in range(count):
        for _ in range(MAX_TRIES):
            t = rng.randrange(len(ids))
            n_sampled = draw_n(rng, max_exponent)
            if any(c.index == t for c in chosen):
                continue
            n = min(n_sampled, len(ids) - t) if clip else n_sampled
            candidate = Insertion(t, n_sampled, n, len(ids) - t)
            trial = sorted([*chosen, candidate], key=lambda c: c.index)
            problem = _problem(tokenizer, ids, trial)
            if problem is None:
                chosen = trial
                break
            redrawn.append(problem)
        else:
            raise ValueError("no clean insertion point")
    text, _ = render(tokenizer, ids, chosen)
    return text, chosen, redrawn


def _problem(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], insertions: list[Insertion]
) -> str | None:
    for ins in insertions:
        if splits_character(tokenizer, ids, ins.index):
            return "splits a character"
    text, befores = render(tokenizer, ids, insertions)
    full_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for before, ins in zip(befores, insertions, strict=True):
        problem = command_problem(tokenizer, full_ids, before, format_relay_call(ins.n))
        if problem is not None:
            return problem
    return None


def response_ids(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[int]:
    """The response's text tokens: a trailing EOS is the chat template's to add back."""
    special = set(tokenizer.all_special_ids)
    end = len(ids)
    while end and ids[end - 1] in special:
        end -= 1
    return list(ids[:end])


def build_relay_warmup(
    config: RelayWarmupConfig,
    progress: Callable[[int, int], None] | None = None,
    engine: Engine | None = None,
) -> BuildResult:
    """Build (or resume) the warm-up set in its folder; see the module docstring."""
    with open_build(config, "warmup-relay", RESUMABLE_KEYS, engine) as (bench, folder):
        units = units_of(bench.items, config.responses_per_problem)
        template = get_prompt(config.prompt)
        new = sample_into(folder, config, template, units, _row_maker(config), progress, engine)
        rows = folder.export()
        stats = relay_stats(config, rows, folder.rejected(), len(units))
        folder.write_stats(stats)
        _plot(folder, rows, stats)
    return BuildResult(folder.path, stats, new)


def _row_maker(config: RelayWarmupConfig) -> Callable[[SoloProtocol], MakeRow]:
    """Rows need the policy's tokenizer: insertion points are its token indices."""

    def for_policy(policy: SoloProtocol) -> MakeRow:
        tokenizer = policy.policy.require_tokenizer("relay warm-up")
        return functools.partial(_make_row, config, tokenizer)

    return for_policy


def _make_row(
    config: RelayWarmupConfig, tokenizer: PreTrainedTokenizerBase, unit: Unit, episode: Episode
) -> dict[str, Any] | str:
    """A row from the unit's response, or why it gives none."""
    ids = response_ids(tokenizer, episode.response_ids)
    reason = _unusable(episode.response_text, ids, config.insertions)
    if reason is not None:
        return reason
    # One generator per unit: its points depend neither on chunking nor on resuming.
    rng = random.Random(f"{config.sampling.seed}:{unit.item.id}:{unit.sample}")
    try:
        text, placed, redrawn = insert_calls(
            tokenizer, ids, config.insertions, rng, config.max_exponent, config.clip_n
        )
    except ValueError as err:
        return str(err)
    return sft_row(
        episode.meta["prompt"],
        text,
        insertions=[vars(p) for p in placed],
        response_tokens=len(ids),
        end=str(episode.end),
        redrawn=redrawn,
    )


def _unusable(text: str, ids: list[int], insertions: int) -> str | None:
    if not ids:
        return "empty response"
    if CALL_OPEN in text or CALL_CLOSE in text:
        return "already holds a call tag"  # its commands would be ours and its own, mixed
    if len(ids) < insertions:
        return "fewer tokens than insertions"
    return None


def _placements(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every inserted command, with the length of the response it went into."""
    return [p | {"tokens": r["response_tokens"]} for r in rows for p in r["insertions"]]


def relay_stats(
    config: RelayWarmupConfig,
    rows: list[dict[str, Any]],
    rejected: list[dict[str, Any]],
    units: int,
) -> dict[str, Any]:
    """What the set holds: counts, n before and after clipping, insertion positions."""
    placed = _placements(rows)
    return {
        "builder": "relay warm-up (RelayLLM §3.1)",
        "model": config.model,
        "data": config.data,
        "units": units,
        "rows": len(rows),
        "rejected": reasons(rejected),
        "insertions": len(placed),
        "clipped": sum(p["n"] < p["n_sampled"] for p in placed),
        "redrawn_points": reasons([{"reason": why} for r in rows for why in r["redrawn"]]),
        "n_sampled": summary([p["n_sampled"] for p in placed]),
        "n": summary([p["n"] for p in placed]),
        "relative_position": summary([p["index"] / p["tokens"] for p in placed]),
        "response_tokens": summary([r["response_tokens"] for r in rows]),
        "truncated_responses": sum(r["end"] == "length" for r in rows),
    }


def _plot(folder: BuildFolder, rows: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    placed = _placements(rows)
    decades = tuple(10.0**k / 1.5 for k in range(6))  # one bin per order of magnitude
    folder.save_plot(
        [
            Panel(
                "n sampled (d·10^k)",
                "n",
                tuple(p["n_sampled"] for p in placed),
                bins=decades,
                log_x=True,
            ),
            Panel("n after clipping", "n", tuple(p["n"] for p in placed), bins=decades, log_x=True),
            Panel(
                "insertion point",
                "t / response tokens",
                tuple(p["index"] / p["tokens"] for p in placed),
                bins=10,
            ),
            Panel("response length", "tokens", tuple(r["response_tokens"] for r in rows)),
        ],
        f"relay warm-up: {stats['rows']} rows from {stats['units']} responses",
    )
