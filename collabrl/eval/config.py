"""Configuration of `collab eval`."""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.config import DataColumns, DecodingConfig, EngineConfig, SamplingConfig, option
from collabrl.engines import is_url
from collabrl.engines.endpoints import check_collaborator, check_reachable
from collabrl.errors import UserError
from collabrl.protocols import registry
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
    num_fewshot: int = option(
        0,
        "Worked examples shown before every problem (lm-eval's --num-fewshot): rows of the "
        "benchmark's training split drawn by fewshot_seed, the same for every problem.",
    )
    fewshot_as_multiturn: bool = option(
        True,
        "Show each example as a user turn and an assistant turn (as lm-eval's "
        "--fewshot_as_multiturn); false: the examples and the problem in one user turn.",
    )
    fewshot_seed: int = option(1234, "Seed of the draw of the few-shot examples.")
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
        if self.judge is not None and not is_url(self.judge):
            raise UserError(
                f"judge '{self.judge}' is not a base URL",
                "pass the judge's OpenAI-compatible server, e.g. --judge http://HOST:8000/v1",
            )
        for key in ("num_fewshot", "fewshot_seed"):
            if getattr(self, key) < 0:
                raise UserError(
                    f"{key} must be >= 0, got {getattr(self, key)}", f"set {key} to 0 or more"
                )
        self.sampling.check()
        self.engine.check()
        registry.check_protocol_config(self.protocol)

    def warnings(self) -> list[str]:
        """What a run with these values can do but a user likely did not mean, one line
        each (the command prints them at its start; `collab config show eval` too)."""
        found = greedy_repeats(self.sampling)
        return [] if found is None else [found]

    def check_collaborators(self) -> None:
        """One request to each server the run calls beside the policy (the served
        collaborators its protocol declares, the judge) and a local collaborator resolved,
        before any work: one that is down or mistyped would otherwise fail the run's calls,
        or its scoring, after the folder is written (`collab train` probes them the same way)."""
        for ref in registry.collaborators_of(self.protocol):
            check_collaborator(ref, self.engine.api_key)
        if self.judge is not None:
            check_reachable(self.judge, self.engine.api_key)


# Keys that may change between a run and its resumption without changing what
# the finished samples mean (resources and bookkeeping, not the experiment).
RESUMABLE_KEYS = frozenset({"limit", "out", "engine", "judge", "judge_model"})


def greedy_repeats(sampling: DecodingConfig) -> str | None:
    """A warning when a problem's samples are drawn greedily (temperature 0, or top_k 1)
    more than once: the policy writes the same text in each, so pass@k (k > 1) and maj@n
    are reported of copies. A warning, not an error: a collaborator that samples (EAPO's
    expert) still varies the episodes, and a repeat measures the engine's determinism."""
    if sampling.n == 1:
        return None
    if sampling.temperature == 0:
        greedy, fix = "sampling.temperature 0", "--temperature above 0 (e.g. 0.6)"
    elif sampling.top_k == 1:
        greedy, fix = "sampling.top_k 1", "sampling.top_k -1 or above 1"
    else:
        return None
    return (
        f"sampling.n is {sampling.n} but decoding is greedy ({greedy}): the policy writes "
        f"the same text in all {sampling.n} samples of a problem, so pass@k (k > 1) and "
        f"maj@{sampling.n} only repeat pass@1; sample with {fix}, or use --n 1"
    )
