"""`collab build-warmup rsim`: rSIM's step-format warm-up set (appendix A.1).

Before rSIM's planner can act "before each step", the reasoner must write steps that
end at `\\n\\n`. The paper samples the reasoner on MATH with a five-example
chain-of-thought prompt whose steps are separated by `\\n\\n`, keeps only samples that
follow that format **and are incorrect** (so fine-tuning on them teaches the format,
not solutions to the training problems), until it has 1,000, and fine-tunes for one
epoch. The paper does not print its five examples; ours are in `EXAMPLES`.

Rows pair the strategy protocol's own reasoner prompt (`STEP_PROMPT`, no examples)
with the sampled steps: after fine-tuning the reasoner writes steps without shots.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collabrl.builders.folder import BuildFolder, BuildResult, reasons, sft_row, summary
from collabrl.builders.plots import Panel
from collabrl.builders.policy import open_build, sample_into
from collabrl.config import MAX_SAMPLES, DataColumns, EngineConfig, SamplingConfig, option
from collabrl.data.prompts import PromptTemplate
from collabrl.engines.base import ChatMessage, Engine
from collabrl.episode import EndReason, Episode
from collabrl.errors import require
from collabrl.protocols.sampling import Unit, units_of
from collabrl.protocols.strategy import STEP_PROMPT
from collabrl.rewards.extract import extract_answer
from collabrl.strategies import STEP_DELIMITER

# Five worked problems, one step per paragraph, the answer boxed in the last step.
EXAMPLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "What is the value of $3x + 2$ when $x = 4$?",
        (
            "Substitute $x = 4$ into the expression: $3 \\cdot 4 + 2$.",
            "Multiply first: $3 \\cdot 4 = 12$.",
            "Then add: $12 + 2 = 14$.",
            "The value is $\\boxed{14}$.",
        ),
    ),
    (
        "A shirt costs $\\$20$ and is on sale for $25\\%$ off. What is the sale price, in dollars?",
        (
            "The discount is $25\\%$ of $20$, which is $0.25 \\cdot 20 = 5$ dollars.",
            "The sale price is the original price minus the discount: $20 - 5 = 15$.",
            "The sale price is $\\boxed{15}$ dollars.",
        ),
    ),
    (
        "Solve for $y$: $2y - 7 = 11$.",
        (
            "Add $7$ to both sides: $2y = 18$.",
            "Divide both sides by $2$: $y = 9$.",
            "Check: $2 \\cdot 9 - 7 = 11$, as required, so $y = \\boxed{9}$.",
        ),
    ),
    (
        "How many positive divisors does $36$ have?",
        (
            "Factor $36$ into primes: $36 = 2^2 \\cdot 3^2$.",
            "A divisor is $2^a 3^b$ with $a \\in \\{0, 1, 2\\}$ and $b \\in \\{0, 1, 2\\}$, "
            "so there are $3 \\cdot 3$ choices.",
            "Hence $36$ has $\\boxed{9}$ positive divisors.",
        ),
    ),
    (
        "The sum of two numbers is $30$ and their difference is $8$. What is the larger number?",
        (
            "Call the numbers $a > b$. Then $a + b = 30$ and $a - b = 8$.",
            "Adding the two equations gives $2a = 38$, so $a = 19$.",
            "Then $b = 30 - 19 = 11$, and indeed $19 - 11 = 8$.",
            "The larger number is $\\boxed{19}$.",
        ),
    ),
)


class FewShotTemplate(PromptTemplate):
    """STEP_PROMPT's system turn, then the examples as user/assistant turns."""

    def messages(self, problem: str) -> list[ChatMessage]:
        turns: list[ChatMessage] = []
        for question, steps in EXAMPLES:
            turns.append({"role": "user", "content": question})
            turns.append({"role": "assistant", "content": STEP_DELIMITER.join(steps)})
        first, *rest = super().messages(problem)
        return [first, *turns, *rest] if first["role"] == "system" else [*turns, first]


FEW_SHOT_PROMPT = FewShotTemplate(
    name="rsim-5shot",
    system=STEP_PROMPT.system,
    user=STEP_PROMPT.user,
    extract=STEP_PROMPT.extract,
    source="rSIM appendix A.1: five chain-of-thought examples, steps separated by \\n\\n",
)


# The paper's set has 1,000 rows; a thousand times that is no warm-up any more.
MAX_ROWS = 1_000_000


@dataclass
class RsimWarmupConfig(DataColumns):
    """rSIM's warm-up set: the reasoner's own step-formatted, incorrect solutions."""

    model: str = option("smollm2-135m", "The reasoner to sample: model reference or URL.")
    data: str = option(
        "math_train", "Training problems: a registered name or a .jsonl/.parquet/folder path."
    )
    rows: int = option(1000, "Stop when the set has this many rows (the paper's N = 1,000).")
    min_steps: int = option(2, "Fewest `\\n\\n`-separated steps a sample must have.")
    samples_per_problem: int = option(1, "Samples drawn per problem.")
    limit: int | None = option(None, "Use only the first N problems (before shuffling).")
    out: str | None = option(
        None, "Output folder (default: a new folder under runs/); an existing one is resumed."
    )
    tokenizer: str | None = option(None, "Local tokenizer of a reasoner served at a URL.")
    sampling: SamplingConfig = option(
        SamplingConfig(max_tokens=1024, temperature=1.0),
        "How the reasoner samples (the paper's 1,024-token generations); seed also "
        "shuffles the problems.",
    )
    engine: EngineConfig = option(EngineConfig(), "The reasoner's engine.")

    def check(self) -> None:
        """Refuse values no build can use, before any data or model is loaded."""
        self.sampling.check()
        self.engine.check()
        require("rows", self.rows, 1 <= self.rows <= MAX_ROWS, f"between 1 and {MAX_ROWS}")
        require("min_steps", self.min_steps, self.min_steps >= 1, "at least 1")
        per_problem = self.samples_per_problem
        ok = 1 <= per_problem <= MAX_SAMPLES
        require("samples_per_problem", per_problem, ok, f"between 1 and {MAX_SAMPLES}")


RESUMABLE_KEYS = frozenset({"limit", "out", "engine", "rows"})


def steps_of(text: str) -> list[str]:
    """The reasoning steps of a response: its `\\n\\n`-separated, non-blank paragraphs."""
    return [step for step in text.strip().split(STEP_DELIMITER) if step.strip()]


def format_problem(episode: Episode, min_steps: int) -> str | None:
    """Why a sample does not follow the step format; None when it does."""
    if episode.end is not EndReason.EOS:
        return f"did not finish ({episode.end})"
    steps = steps_of(episode.response_text)
    if len(steps) < min_steps:
        return f"fewer than {min_steps} steps"
    if not extract_answer(steps[-1], ("boxed",)):
        return "no \\boxed{} answer in the last step"
    return None


def build_rsim_warmup(
    config: RsimWarmupConfig,
    progress: Callable[[int, int], None] | None = None,
    engine: Engine | None = None,
) -> BuildResult:
    """Build (or resume) the warm-up set; see the module docstring."""
    with open_build(config, "warmup-rsim", RESUMABLE_KEYS, engine) as (bench, folder):
        items = list(bench.items)
        random.Random(config.sampling.seed).shuffle(items)  # MATH is ordered by subject
        units = units_of(items, config.samples_per_problem)
        make_row = _row_maker(config)
        new = sample_into(
            folder,
            config,
            FEW_SHOT_PROMPT,
            units,
            lambda _: make_row,
            progress,
            engine,
            config.rows,
        )
        rows = folder.export()
        stats = rsim_stats(config, rows, folder.rejected(), len(units))
        folder.write_stats(stats)
        _plot(folder, rows, stats)
    return BuildResult(folder.path, stats, new)


def _row_maker(config: RsimWarmupConfig) -> Callable[[Unit, Episode], dict[str, Any] | str]:
    def make_row(unit: Unit, episode: Episode) -> dict[str, Any] | str:
        problem = format_problem(episode, config.min_steps)
        if problem is not None:
            return problem
        if unit.item.is_correct(episode.answer):
            return "correct (it would teach the solution)"
        text = episode.response_text.strip()
        return sft_row(
            STEP_PROMPT.messages(unit.item.problem),
            text,
            steps=len(steps_of(text)),
            answer=episode.answer,
            gold=unit.item.answer,
            response_tokens=len(episode.response_ids),
        )

    return make_row


def rsim_stats(
    config: RsimWarmupConfig, rows: list[dict[str, Any]], rejected: list[dict[str, Any]], units: int
) -> dict[str, Any]:
    """What the set holds: rows against the target, steps per row, why samples failed."""
    return {
        "builder": "rSIM step-format warm-up (appendix A.1)",
        "model": config.model,
        "data": config.data,
        "rows": len(rows),
        "rows_wanted": config.rows,
        "complete": len(rows) >= config.rows,
        "sampled": len(rows) + len(rejected),
        "units_available": units,
        "rejected": reasons(rejected),
        "steps": summary([r["steps"] for r in rows]),
        "response_tokens": summary([r["response_tokens"] for r in rows]),
    }


def _plot(folder: BuildFolder, rows: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    folder.save_plot(
        [
            Panel("steps per row", "steps", tuple(r["steps"] for r in rows)),
            Panel("response length", "tokens", tuple(r["response_tokens"] for r in rows)),
            Panel("samples rejected", "reason", counts=tuple(stats["rejected"].items())),
        ],
        f"rSIM warm-up: {stats['rows']} of {stats['rows_wanted']} rows "
        f"from {stats['sampled']} samples",
    )
