"""Configuration of `collab eval`."""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.config import DataColumns, EngineConfig, SamplingConfig, option
from collabrl.protocols.config import ProtocolConfig


@dataclass
class EvalConfig(DataColumns):
    """One evaluation run: a model sampled on a benchmark, scored and summarized."""

    benchmark: str = option(
        "gsm8k",
        "Registered benchmark name or a .jsonl/.parquet/folder path; several, comma-separated "
        "(aime24,math500), run in turn, each into its own folder (under --out: DIR/<name>).",
    )
    model: str = option(
        "smollm2-135m",
        "The policy (reasoner): model reference (embedded name, folder, .gguf, LoRA) or URL.",
    )
    prompt: str | None = option(
        None, "Prompt template: relay, eapo-eval, plain (default: the benchmark's)."
    )
    limit: int | None = option(None, "Evaluate only the first N problems.")
    out: str | None = option(
        None, "Run folder (default: a new folder under runs/); an existing one is resumed."
    )
    judge: str | None = option(
        None, "Base URL of an OpenAI-compatible LLM judge for answers the rules reject."
    )
    judge_model: str | None = option(None, "Model name at the judge endpoint.")
    protocol: ProtocolConfig = option(
        ProtocolConfig(), "Who writes next: the protocol and its teacher, experts or planner."
    )
    sampling: SamplingConfig = option(
        SamplingConfig(), "How completions are sampled (max_tokens bounds a whole episode)."
    )
    engine: EngineConfig = option(EngineConfig(), "Which engine generates text.")

    def check(self) -> None:
        """Refuse values no run can use, before the benchmark or any model is loaded (the
        benchmark, the prompt and the run folder are checked as the run opens them)."""
        self.sampling.check()
        self.engine.check()
        self.protocol.check()


# Keys that may change between a run and its resumption without changing what
# the finished samples mean (resources and bookkeeping, not the experiment).
RESUMABLE_KEYS = frozenset({"limit", "out", "engine", "judge", "judge_model"})
