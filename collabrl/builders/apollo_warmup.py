"""`collab build-warmup apollo`: tool traces that end in a boxed answer (this project's).

AlphaApollo's models call tools because they are large and the A.1 prompt offers them;
the paper trains nothing. SmolLM2-135M, asked the same, rarely calls and answers in
prose ("The product is 14."), so tool-integrated RL (`collab train grpo --protocol
apollo`) has no call to reinforce and no `\\boxed{}` to reward. This set teaches the
tool turn first.

Every problem is sampled under the apollo protocol with its sampling aids
(`apollo.force_call`, `apollo.few_shot`: the policy is made to open a call and shown one
worked call of `apollo.aid_tool`: python, or retrieve for questions answered in the
documentation), and the tools run what it calls. A trace becomes rows when its last
call ran without error and gave the gold answer: a python call printed it as its last
line, a retrieve call returned documentation in which it is written (`rtol=1e-05`). Its rows:

- a call row for each policy turn that ended in `</tool_call>` (failed calls and the
  error messages that answered them stay: they teach the error correction);
- an answer row after the last `<tool_response>` block: "The answer is \\boxed{X}.",
  X the value as the tool wrote it. It replaces what the policy wrote there, because the model
  this is for does not box its answers.

The rows are text prompt–completion pairs asked with the prompt training uses, the A.1
prompt without the aids (`apollo_prompt(specs, few_shot=False)`), rendered with the
policy's chat template; a forced call's opening (the tag, for retrieve also the call's
name) is the first completion's own text.
Tool output and protocol tags sit in the prompts, so they carry no loss. A trace's rows
are one line of rows.jsonl, so a killed build never keeps half a trace.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collabrl.builders.folder import BuildFolder, BuildResult, reasons, summary
from collabrl.builders.plots import Panel
from collabrl.builders.policy import open_build, sample_into
from collabrl.builders.sampling import MakeRow
from collabrl.config import MAX_SAMPLES, DataColumns, EngineConfig, SamplingConfig, option
from collabrl.engines.base import Engine
from collabrl.episode import Author, Episode, Segment
from collabrl.errors import require
from collabrl.protocols.apollo import ApolloConfig, apollo_prompt
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.sampling import Unit, units_of

if TYPE_CHECKING:
    from collabrl.data.benchmarks import Item
    from collabrl.protocols.apollo import ApolloProtocol
    from collabrl.protocols.base import Policy

ANSWER = "The answer is \\boxed{{{value}}}."


def _sampling_tools() -> ApolloConfig:
    return ApolloConfig(tools=["python"], few_shot=True, force_call=True)


@dataclass
class ApolloWarmupConfig(DataColumns):
    """A warm-up set for tool-integrated reasoning: the policy's own correct tool traces."""

    model: str = option(
        "smollm2-135m", "The policy whose tool traces are sampled: model reference or URL."
    )
    data: str = option(
        "arith_train", "Training problems: a registered name or a .jsonl/.parquet/folder path."
    )
    samples_per_problem: int = option(1, "Traces sampled per problem.")
    limit: int | None = option(None, "Use only the first N problems.")
    out: str | None = option(
        None, "Output folder (default: a new folder under runs/); an existing one is resumed."
    )
    tokenizer: str | None = option(None, "Local tokenizer of a policy served at a URL.")
    apollo: ApolloConfig = option(
        _sampling_tools(),
        "The tools the traces are sampled with, and the sampling aids (force_call, "
        "few_shot); the rows' prompt offers the same tools without the aids.",
    )
    sampling: SamplingConfig = option(
        SamplingConfig(max_tokens=256, temperature=1.0), "How the policy's traces are sampled."
    )
    engine: EngineConfig = option(EngineConfig(), "The policy's engine.")

    def check(self) -> None:
        """Refuse values no build can use, before any data or model is loaded."""
        self.sampling.check()
        self.engine.check()
        self.apollo.check()
        per_problem = self.samples_per_problem
        ok = 1 <= per_problem <= MAX_SAMPLES
        require("samples_per_problem", per_problem, ok, f"between 1 and {MAX_SAMPLES}")

    def protocol(self) -> ProtocolConfig:
        return ProtocolConfig(name="apollo", apollo=self.apollo)


# Resources and bookkeeping: changing them keeps the rows' meaning.
RESUMABLE_KEYS = frozenset({"limit", "out", "engine"})


def build_apollo_warmup(
    config: ApolloWarmupConfig,
    progress: Callable[[int, int], None] | None = None,
    engine: Engine | None = None,
) -> BuildResult:
    """Build (or resume) the warm-up set in its folder; see the module docstring."""
    with open_build(config, "warmup-apollo", RESUMABLE_KEYS, engine) as (bench, folder):
        units = units_of(bench.items, config.samples_per_problem)
        new = sample_into(
            folder, config, None, units, _row_maker, progress, engine, protocol=config.protocol()
        )
        rows = folder.export(training_rows)
        stats = apollo_stats(config, folder.rows(), rows, folder.rejected(), len(units))
        folder.write_stats(stats)
        _plot(folder, stats)
    return BuildResult(folder.path, stats, new)


def _row_maker(protocol: ApolloProtocol) -> MakeRow:
    """Rows are rendered with the policy's chat template and the aid-free A.1 prompt."""
    policy = protocol.policy
    policy.require_tokenizer("apollo warm-up")
    prompt = apollo_prompt(protocol.router.specs(), few_shot=False)

    def make_row(unit: Unit, episode: Episode) -> dict[str, Any] | str:
        assert policy.tokenizer is not None  # required above
        start = policy.tokenizer.decode(policy.prompt_ids(prompt.messages(unit.item.problem)))
        return trace_rows(policy, start, episode, unit.item)

    return make_row


def printed_value(segment: Segment) -> str:
    """The last line a tool call printed."""
    lines = segment.text.strip().splitlines()
    return lines[-1].strip() if lines else ""


# The words of a retrieved text that may be a value: `1e-05` and `'auto'` of `rtol=1e-05,
# mode='auto')`, `None` of `|  initial=None`.
_WORDS = re.compile(r"[^\s,()\[\]{}:;=|]+")


def answer_shown(call: Segment, item: Item) -> str | None:
    """The answer the call gave, as the tool wrote it, or None: a python call's last
    printed line; for a retrieve call, the first word of the documentation it returned
    that is the gold answer (`1e-05`, `None`), the value the policy reads there."""
    if call.meta.get("tool") == "retrieve":
        words = dict.fromkeys(_WORDS.findall(call.text))  # each once, in order
        return next((word for word in words if item.is_correct(word)), None)
    value = printed_value(call)
    return value if value and item.is_correct(value) else None


def trace_rows(policy: Policy, start: str, episode: Episode, item: Item) -> dict[str, Any] | str:
    """The trace's rows as one line of rows.jsonl (see `training_rows`), or why it gives none."""
    calls = episode.tool_calls
    if not calls:
        return "no tool call"
    last = calls[-1]
    if last.meta.get("error") is not None:
        return f"last call failed ({last.meta['error']})"
    value = answer_shown(last, item)
    if value is None:
        shown = "show" if last.meta.get("tool") == "retrieve" else "print"
        return f"last call did not {shown} the answer"
    end = episode.segments.index(last) + 2  # the tool segment, then the closing tag
    # Every policy turn before the last response ended in a call: the protocol only
    # resumes the policy after one.
    rows, context, pending = [], start, ""
    for segment in episode.segments[:end]:
        if segment.meta.get("forced_call"):
            pending = segment.text  # the opening tag the protocol wrote is taught as the policy's
            continue
        if segment.author is Author.POLICY:
            rows.append(_row(policy, context, pending + segment.text, "call"))
            context += pending
            pending = ""
        context += segment.text
    rows.append(_row(policy, context, ANSWER.format(value=value), "answer"))
    return {
        "rows": rows,
        "tool_calls": len(calls),
        "failed_calls": episode.tool_errors,
        "answer": value,
        "response_tokens": len(episode.response_ids),
    }


def _row(policy: Policy, prompt: str, completion: str, kind: str) -> dict[str, Any]:
    """One text row, with its token counts (what a trainer's max_length must hold)."""
    return {
        "prompt": prompt,
        "completion": completion,
        "kind": kind,
        "prompt_tokens": len(policy.encode(prompt)),
        "completion_tokens": len(policy.encode(completion)),
    }


def training_rows(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The training rows of one line of rows.jsonl: the trace's rows, each with its unit's key."""
    key = {"item_id": line["item_id"], "sample": line["sample"]}
    return [{**row, **key} for row in line["rows"]]


def apollo_stats(
    config: ApolloWarmupConfig,
    traces: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    rejected: list[dict[str, Any]],
    units: int,
) -> dict[str, Any]:
    """What the set holds: traces and rows, the calls in them, rejections, lengths."""
    return {
        "builder": "apollo tool-trace warm-up (this project's; AlphaApollo trains none)",
        "model": config.model,
        "data": config.data,
        "tools": list(config.apollo.tools),
        "units": units,
        "traces": len(traces),
        "rows": len(rows),
        "call_rows": sum(r["kind"] == "call" for r in rows),
        "answer_rows": sum(r["kind"] == "answer" for r in rows),
        "rejected": reasons(rejected),
        "tool_calls": summary([t["tool_calls"] for t in traces]),
        # Traces whose last call fixed an earlier failed one: the error correction taught.
        "traces_with_a_failed_call": sum(t["failed_calls"] > 0 for t in traces),
        "response_tokens": summary([t["response_tokens"] for t in traces]),
        "row_tokens": summary([r["prompt_tokens"] + r["completion_tokens"] for r in rows]),
    }


def _plot(folder: BuildFolder, stats: dict[str, Any]) -> None:
    rejected = sum(stats["rejected"].values())
    folder.save_plot(
        [
            Panel("units", "became", counts=(("traces", stats["traces"]), ("rejected", rejected))),
            Panel(
                "rows",
                "kind",
                counts=(("call", stats["call_rows"]), ("answer", stats["answer_rows"])),
            ),
            Panel("units rejected", "reason", counts=tuple(stats["rejected"].items())),
        ],
        f"apollo warm-up: {stats['traces']} traces ({stats['rows']} rows) "
        f"from {stats['units']} samples",
    )
