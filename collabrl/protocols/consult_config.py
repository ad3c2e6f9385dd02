"""EAPO's options (`protocol.consult`) and the episode budget one consult turn needs:
config only, so that `ProtocolConfig` and a trainer's config read them without loading
the protocol (`protocols/consult.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.config import option
from collabrl.errors import UserError

MODES = ("open", "locked")


@dataclass
class ConsultConfig:
    """How the policy may consult the expert panel (EAPO)."""

    mode: str = option(
        "open",
        "open: the training prompt of EAPO appendix D with the expert channel (training, and "
        "the paper's Expert-Assisted Workflow baseline); "
        "locked: the evaluation prompt, no experts.",
    )
    num_experts: int = option(
        3, "K: experts on the panel, ids 1..K; the expert pool must have the same K."
    )
    query_budget: int = option(
        10,
        "Expert queries per episode (the prompt's 'ask experts 10 times totally'); "
        "calls past it read unavailable.",
    )
    turn_budget: int = option(
        6, "Policy turns per episode; a call made on the last turn ends the episode unanswered."
    )
    accept_prob: float = option(
        1.0,
        "rho: a returned expert answer is written into the history iff u <= rho, u ~ U(0,1]; "
        "otherwise it reads unavailable. The trainer anneals it (rho_s = 1/s).",
    )
    expert_max_tokens: int = option(
        512,
        "Tokens an expert may write per answer; answers cut there are logged as "
        "episodes/expert_truncated. EAPO gives no cap (only its expert server's 32768-token "
        "context); K answers must also fit one turn of sampling.max_tokens.",
    )
    expert_temperature: float = option(
        1.0,
        "Expert sampling temperature; 0 is greedy. Sampled by default (EAPO Table 4's 1.0): "
        "K experts asked one question must be able to differ, each call has its own seed.",
    )
    expert_top_p: float = option(1.0, "Expert nucleus sampling cut-off, in (0, 1].")
    expert_timeout: float = option(
        600.0, "Seconds one expert call may take (a local CPU expert writes ~15 tokens/s)."
    )
    self_collab: bool = option(
        False,
        "Experts are copies of the policy model (the paper's Self Collaboration baseline); "
        "the expert pool is then built from the policy's model reference.",
    )

    def check(self) -> None:
        if self.mode not in MODES:
            raise UserError(f"unknown consult mode '{self.mode}'", f"use {' or '.join(MODES)}")
        if self.num_experts < 1:
            raise UserError(f"consult.num_experts must be >= 1, got {self.num_experts}")
        if self.query_budget < 0:
            raise UserError(f"consult.query_budget must be >= 0, got {self.query_budget}")
        if self.turn_budget < 1:
            raise UserError(f"consult.turn_budget must be >= 1, got {self.turn_budget}")
        if not 0.0 <= self.accept_prob <= 1.0:
            raise UserError(f"consult.accept_prob must be in [0, 1], got {self.accept_prob}")
        if self.expert_max_tokens < 1:
            raise UserError(f"consult.expert_max_tokens must be >= 1, got {self.expert_max_tokens}")
        if self.expert_temperature < 0:
            raise UserError(
                f"consult.expert_temperature must be >= 0, got {self.expert_temperature}"
            )
        if not 0.0 < self.expert_top_p <= 1.0:
            raise UserError(f"consult.expert_top_p must be in (0, 1], got {self.expert_top_p}")
        if self.expert_timeout <= 0:
            raise UserError(f"consult.expert_timeout must be > 0, got {self.expert_timeout}")
        if self.self_collab and self.mode != "open":
            raise UserError(
                "consult.self_collab needs mode open: the locked mode consults no experts",
                "drop --self-collab, or --set protocol.consult.mode=open",
            )


# What one full turn needs beyond the experts' answers, in policy tokens. Measured in
# SmolLM2's tokenizer: a call item with a one-line query and its share of the returns
# scaffolding come to ~55 tokens per expert, a final "Answer: …" line to ~6.
CALL_TOKENS = 64
ANSWER_TOKENS = 16


def turn_tokens(config: ConsultConfig) -> int:
    """The fewest episode tokens one full turn of open mode takes: a query to each of the
    K experts, their K answers of up to `expert_max_tokens`, and the final answer."""
    return config.num_experts * (config.expert_max_tokens + CALL_TOKENS) + ANSWER_TOKENS


def check_turn_fits(config: ConsultConfig, max_tokens: int) -> None:
    """Refuse an episode budget (`max_tokens`, every author's tokens) that cannot hold one
    full turn: asking every expert would then end the episode at LENGTH with no returns
    written, and training would punish the consultation the method is about (issue 32:
    3 × 8192 answers in a 20480-token episode)."""
    if config.mode != "open":
        return
    need = turn_tokens(config)
    if need > max_tokens:
        raise UserError(
            f"sampling.max_tokens {max_tokens} cannot hold one consult turn of {need} tokens: "
            f"{config.num_experts} expert answers × {config.expert_max_tokens}, "
            f"{config.num_experts} calls × {CALL_TOKENS} and a {ANSWER_TOKENS}-token answer",
            "lower protocol.consult.expert_max_tokens (--expert-max-tokens) or "
            "num_experts, or raise sampling.max_tokens (--max-tokens)",
        )
