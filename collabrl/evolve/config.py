"""Configuration of `collab evolve`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from collabrl.config import DataColumns, EngineConfig, SamplingConfig, option
from collabrl.engines.reference import is_stand_in
from collabrl.errors import UserError, require
from collabrl.evolve.select import SELECTORS
from collabrl.protocols import registry
from collabrl.protocols.config import ProtocolConfig
from collabrl.tools.sandbox import SandboxLimits

SELECT_RULES = tuple(SELECTORS)
# Every round's candidates stay in memory (the state the digests read); papers run a few.
MAX_ROUNDS = 100


@dataclass
class EvolveConfig(DataColumns):
    """K models × R rounds of proposals over a shared, growing state of verified candidates."""

    benchmark: str = option("arith", "Registered benchmark name or a .jsonl/.parquet/folder path.")
    models: list[str] = option(
        [],
        "The K proposing models: model references or base URLs (repeat --model); the same "
        "reference twice is two branches of one model.",
    )
    rounds: int = option(2, "R: rounds of proposals; round r > 1 reads the state of rounds < r.")
    verifiers: list[str] = option(
        [],
        "Models that review every candidate (references or URLs). Default: each candidate is "
        "reviewed by the other proposing models (by its own model when K = 1).",
    )
    select: str = option(
        "score",
        "The final answer's rule: score (highest summed review score), vote (majority) or "
        "verified (majority of the candidates whose re-run code agrees with their answer, "
        "else of those not refuted); all three are reported every round.",
    )
    execute: bool = option(
        True,
        "Re-run every candidate's code (its python tool calls, else its code blocks, else "
        "the arithmetic its answer is written as) in the sandbox and check what it prints "
        "against its answer; off, every candidate is unverified and `verified` is the vote.",
    )
    sandbox: SandboxLimits = option(
        SandboxLimits(),
        "Limits of each re-run of a candidate's code (execute); docs/tools.md.",
    )
    digest_size: int = option(3, "m: earlier candidates of a problem shown in a round's prompt.")
    trim_chars: int = option(
        600, "Characters of a candidate's solution kept in the digest (reviews keep half)."
    )
    review_max_tokens: int = option(256, "Tokens a reviewer may write per candidate.")
    prompt: str | None = option(
        None, "Proposals' prompt template: relay, eapo-eval, plain (default: the benchmark's)."
    )
    limit: int | None = option(None, "Evolve only the first N problems.")
    out: str | None = option(
        None, "Run folder (default: a new folder under runs/); resume one with --resume."
    )
    protocol: ProtocolConfig = option(
        ProtocolConfig(name="apollo"),
        "The protocol every proposal runs through: apollo gives each model the tools "
        "(an endpoint needs --tokenizer); solo proposes without them.",
    )
    sampling: SamplingConfig = option(
        SamplingConfig(n=2, max_tokens=512, temperature=0.7),
        "How proposals are sampled; n is the branches: candidates per model, problem and round.",
    )
    engine: EngineConfig = option(EngineConfig(), "Which engine runs each model and verifier.")

    FIELD_HELP: ClassVar[dict[str, str]] = {
        "sampling.n": "Branches: candidates each model proposes per problem and round."
    }

    def check(self) -> None:
        """Refuse values no run can use, before the benchmark or any model is loaded."""
        if not self.models:
            raise UserError("evolve needs at least one model", "pass --model A --model B")
        ok = 1 <= self.rounds <= MAX_ROUNDS
        require("rounds", self.rounds, ok, f"between 1 and {MAX_ROUNDS}")
        require("select", self.select, self.select in SELECT_RULES, " or ".join(SELECT_RULES))
        require("digest_size", self.digest_size, self.digest_size >= 1, "at least 1")
        require("trim_chars", self.trim_chars, self.trim_chars >= 20, "at least 20")
        require("review_max_tokens", self.review_max_tokens, self.review_max_tokens >= 1, ">= 1")
        self.sandbox.check()
        self.sampling.check()
        self.engine.check()
        registry.check_protocol_config(self.protocol)
        stand_ins = any(map(is_stand_in, [*self.models, *self.verifiers]))
        if registry.uses_reference(self.protocol) or stand_ins:
            raise UserError(
                "the reference stand-in reads gold answers, which evolve never shows a model",
                "use real collaborators",
            )


# Keys that may change when a run is resumed: more rounds, other resources.
RESUMABLE_KEYS = frozenset({"rounds", "out", "engine", "select"})
