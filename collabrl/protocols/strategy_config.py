"""rSIM's options (`protocol.strategy`): config only, so that `ProtocolConfig` and a
trainer's config read them without loading the protocol (`protocols/strategy.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.config import option
from collabrl.errors import UserError
from collabrl.strategies import STRATEGY_NAMES

PLANNER_KINDS = ("rsim", "prompting", "ps+")
# What ends an episode besides max_steps and the token budget (StrategyConfig.end).
END_MODES = ("terminal", "eos")


@dataclass
class StrategyConfig:
    """How the planner and the reasoner take turns (rSIM)."""

    planner_kind: str = option(
        "rsim",
        "rsim: a causal LM with a 9-way action head picks each strategy; prompting: an LLM is "
        "asked to name it (the paper's Planner Prompting baseline); ps+: no planner, the "
        "Plan-and-Solve+ prompt and one response (the PS+ baseline).",
    )
    max_steps: int = option(
        12, "Strategies per episode (terminal included); the episode ends after the last step."
    )
    step_max_tokens: int = option(256, "Tokens the reasoner may write in one step.")
    planner_temperature: float = option(
        1.0,
        "Planner sampling temperature (softmax(logits / T), or the prompted LLM's); "
        "1 samples as in RL rollouts, 0 takes the argmax (the paper's evaluation).",
    )
    summary_chars: int = option(
        200,
        "f_obs: the planner sees each finished step on one line, cut to this many characters "
        "(head … tail); 0 shows whole steps.",
    )
    head_seed: int = option(
        0, "Seed of the rsim action head's random initialisation (a backbone without a head)."
    )
    masked: list[str] = option(
        [],
        "Strategies the rsim planner may not choose (rSIM Table 5 masks one at a time), by "
        "name, e.g. [self-reflection]; empty: all nine.",
    )
    end: str = option(
        "terminal",
        "What ends an episode besides max_steps and the token budget. terminal: only the "
        "planner choosing terminal (rSIM Algorithm 1, 'while a_trace is not Terminal'); a "
        "reasoner EOS inside a step is dropped and the planner is asked again. eos: also "
        "the reasoner's EOS (appendix A.7, 'terminates when a terminal strategy is chosen or "
        "an end-of-sequence is reached').",
    )

    def masked_indices(self) -> tuple[int, ...]:
        """The masked strategies' action indices."""
        return tuple(STRATEGY_NAMES.index(name) for name in self.masked)

    def check(self) -> None:
        if self.planner_kind not in PLANNER_KINDS:
            raise UserError(
                f"unknown planner kind '{self.planner_kind}'", f"use {', '.join(PLANNER_KINDS)}"
            )
        if self.max_steps < 1:
            raise UserError(f"strategy.max_steps must be >= 1, got {self.max_steps}")
        if self.step_max_tokens < 1:
            raise UserError(f"strategy.step_max_tokens must be >= 1, got {self.step_max_tokens}")
        if self.planner_temperature < 0:
            raise UserError(
                f"strategy.planner_temperature must be >= 0, got {self.planner_temperature}"
            )
        if self.summary_chars != 0 and self.summary_chars < 8:
            raise UserError(f"strategy.summary_chars must be 0 or >= 8, got {self.summary_chars}")
        if self.end not in END_MODES:
            raise UserError(f"unknown strategy.end '{self.end}'", f"use {' or '.join(END_MODES)}")
        self._check_masked()

    def _check_masked(self) -> None:
        unknown = [name for name in self.masked if name not in STRATEGY_NAMES]
        if unknown:
            raise UserError(
                f"strategy.masked names unknown strategies: {', '.join(unknown)}",
                f"use names among {', '.join(STRATEGY_NAMES)}",
            )
        if self.masked and self.planner_kind != "rsim":
            raise UserError(
                f"strategy.masked applies to the rsim planner, not to {self.planner_kind}",
                "drop strategy.masked, or use --planner-kind rsim",
            )
        if len(set(self.masked)) == len(STRATEGY_NAMES):
            raise UserError("strategy.masked removes all nine strategies", "keep at least one")
