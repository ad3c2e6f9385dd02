"""rSIM training (`collab train rsim`): what the planner and the reasoner learn from.

rSIM (seed 004, §4 and appendix A.4-A.8) trains a planner (leader) and the reasoner
(follower) together on the `strategy` protocol's episodes. §4's objective is

    J = 1/G Σ_j 1/|o_j| Σ_t [λ · planner ratio · A^p + (1 − λ) · reasoner ratio · A]

with λ = 0.7 for the first N steps (the planner first), then 0.3 (the reasoner). Both
advantages are group-relative: the reasoner's is TRL's, over R = R_acc + R_format +
R_follow; the planner's is computed here, over R^p = R_acc + R_terminal + R_penalty,
and every token of a step carries the ratio and advantage of the strategy that guided
it (A.8: the action's reward goes to what it guided), so a decision weighs by the
tokens it guided (`planner_token_weights`).

λ acts through the learning rates, not the loss: the two agents share no parameter and
AdamW divides each parameter's step by its own gradient scale, so a loss weight would
cancel out. The planner's rate is multiplied by λ and the reasoner's by 1 − λ
(`agent_lr_factors`), which is what the weighted objective does under plain SGD; the
two loss terms are then summed unweighted.

This module holds the λ schedule, what the trainer reads of an episode and
the planner's loss, all plain functions (the config is `rsim_config.py`);
`rsim_trainer.py` puts them into TRL's GRPOTrainer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl.episode import Author, EndReason, Episode
from collabrl.protocols.strategies import PlannerContext
from collabrl.protocols.strategy import planner_contexts
from collabrl.strategies import STRATEGY_NAMES
from collabrl.train.rsim_config import RSIMConfig, default_switch_step

if TYPE_CHECKING:
    import torch

PLANNER_DIR = "planner"  # the planner's folder in a checkpoint and in the run folder
STRATEGY_PLOT = "strategies.png"


def planner_weight(step: int, config: RSIMConfig, max_steps: int) -> float:
    """λ at 1-based optimizer step `step`: the two-stage schedule under joint training,
    1 when only the planner learns and 0 when only the reasoner does."""
    if step < 1:
        raise ValueError(f"training steps count from 1, got {step}")
    if config.train == "planner":
        return 1.0
    if config.train == "reasoner":
        return 0.0
    switch = config.lambda_switch_step or default_switch_step(max_steps)
    return config.lambda_first if step <= switch else config.lambda_after


@dataclass(frozen=True)
class AgentRates:
    """What each agent's learning rate is multiplied by at one step."""

    planner: float
    reasoner: float


def agent_lr_factors(step: int, config: RSIMConfig, max_steps: int) -> AgentRates:
    """The learning-rate multipliers at 1-based step `step`: λ for the planner, 1 − λ for
    the reasoner. AdamW's step is invariant to a gradient's scale, so this (and not a
    loss weight) is how λ changes how far each agent moves: under SGD the two agree."""
    weight = planner_weight(step, config, max_steps)
    return AgentRates(planner=weight, reasoner=1.0 - weight)


# -- what the trainer reads of an episode ----------------------------------------------


@dataclass(frozen=True)
class PlannerSteps:
    """The planner's decisions in one episode: what it saw, what it chose, the
    log-probability the choice had when it was sampled (the PPO ratio's denominator)
    and how many reasoner tokens the step it guided holds (its weight in §4's sum over
    tokens)."""

    contexts: list[PlannerContext]
    actions: list[int]
    old_logps: list[float]
    tokens: list[int]


def planner_steps(episode: Episode) -> PlannerSteps:
    """Every rsim planner decision of a `strategy` episode, in order."""
    guidance = [s for s in episode.segments if s.author is Author.GUIDANCE]
    missing = [s.meta.get("strategy") for s in guidance if "logprob" not in s.meta]
    if missing:
        raise ValueError(
            f"episode {episode.problem_id} has strategies without a sampling log-prob "
            f"({missing[0]}): only an rsim planner's episodes train a planner"
        )
    return PlannerSteps(
        planner_contexts(episode),
        [int(s.meta["index"]) for s in guidance],
        [float(s.meta["logprob"]) for s in guidance],
        guided_token_counts(episode),
    )


def guided_token_counts(episode: Episode) -> list[int]:
    """The reasoner's tokens after each guidance segment, up to the next one: the tokens
    whose ratio and advantage are that decision's in §4's per-token objective."""
    counts: list[int] = []
    for segment in episode.segments:
        if segment.author is Author.GUIDANCE:
            counts.append(0)
        elif segment.author is Author.POLICY and counts:
            counts[-1] += len(segment.token_ids)
    return counts


# Why a `strategy` episode ended, as logged: planner/end_<reason>, shares summing to 1.
END_REASONS: tuple[str, ...] = (
    EndReason.TERMINAL,
    EndReason.EOS,
    EndReason.MAX_STEPS,
    EndReason.LENGTH,
    EndReason.EMPTY,
    EndReason.ERROR,
)


def end_shares(ends: Sequence[str]) -> dict[str, float]:
    """The share of episodes that ended for each of END_REASONS (0 with no episode).
    Under `end: terminal` the eos share stays 0; a high length + max_steps share means
    the budget cuts episodes, which makes choosing terminal first the planner's best
    bet (docs/training.md)."""
    counts = Counter(str(end) for end in ends)
    unknown = set(counts) - set(END_REASONS)
    if unknown:
        raise ValueError(f"not a strategy episode's end: {', '.join(sorted(unknown))}")
    total = len(ends)
    return {str(reason): counts[reason] / total if total else 0.0 for reason in END_REASONS}


# -- the planner's loss ------------------------------------------------------------------


def without_failed(advantages: Sequence[float], episodes: Sequence[Episode]) -> list[float]:
    """The planner's advantages with those of failed episodes set to 0: an ERROR episode
    failed in the toolkit, not by the planner's choices, so they are not judged, as the
    policy's tokens of such an episode are masked (`rollout.to_trl`). The episode keeps
    its reward in its group's statistics."""
    return [
        0.0 if episode.end is EndReason.ERROR else float(advantage)
        for advantage, episode in zip(advantages, episodes, strict=True)
    ]


def planner_token_weights(tokens: Sequence[Sequence[int]]) -> list[float]:
    """Each planner decision's weight in §4's objective 1/G Σ_j 1/|o_j| Σ_t, flattened
    in order: decision i of sample j carries the n_ji tokens of the step it guided, so
    its weight is n_ji / |o_j| / G, with |o_j| = Σ_i n_ji the sample's reasoner tokens
    and G the samples given (TRL's `grpo` loss averages the reasoner's the same way).
    A decision that guided no token, and every decision of a sample with none, weighs 0.
    """
    samples = len(tokens)
    weights: list[float] = []
    for row in tokens:
        total = sum(row)
        weights.extend(n / total / samples if total else 0.0 for n in row)
    return weights


@dataclass(frozen=True)
class PlannerBatch:
    """The planner decisions of a micro-batch, flattened in order, with what the loss
    gives each: its sampling log-prob, its sample's advantage and its weight."""

    contexts: list[PlannerContext]
    actions: list[int]
    old_logps: list[float]
    advantages: list[float]
    weights: list[float]

    def chunks(self, size: int) -> list[PlannerBatch]:
        """Consecutive parts of at most `size` decisions (at least one part)."""
        starts = range(0, max(len(self.actions), 1), size)
        return [
            PlannerBatch(
                self.contexts[i : i + size],
                self.actions[i : i + size],
                self.old_logps[i : i + size],
                self.advantages[i : i + size],
                self.weights[i : i + size],
            )
            for i in starts
        ]


def planner_batch(inputs: dict[str, Any]) -> PlannerBatch:
    """The decisions of a TRL micro-batch (`RSIMTrainer` puts them there), each sample's
    advantage on every one of its decisions (A.8), weighed by `planner_token_weights`.
    A micro-batch without any decision gets one stand-in, weighed 0: every process then
    runs the planner forward and backward, and DDP, which all-reduces in it, stays in step."""
    rows = inputs["planner_contexts"]
    per_row = inputs["planner_advantages"].tolist()
    batch = PlannerBatch(
        [c for row in rows for c in row],
        [a for row in inputs["planner_actions"] for a in row],
        [lp for row in inputs["planner_old_logps"] for lp in row],
        [a for a, row in zip(per_row, rows, strict=True) for _ in row],
        planner_token_weights(inputs["planner_tokens"]),
    )
    if not batch.actions:
        return PlannerBatch([PlannerContext("")], [0], [0.0], [0.0], [0.0])
    return batch


def planner_clip_loss(
    new_logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped objective over planner actions, summed with `weights`
    (`planner_token_weights`) and negated as a loss, and the share of actions whose
    ratio was clipped. All four tensors are [A], one entry per action."""
    import torch

    ratio = torch.exp(new_logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    objective = torch.minimum(ratio * advantages, clipped * advantages)
    was_clipped = ((ratio < 1 - epsilon_low) & (advantages < 0)) | (
        (ratio > 1 + epsilon_high) & (advantages > 0)
    )
    return -(weights * objective).sum(), was_clipped.float().mean()


def plot_strategies(history: list[dict[str, Any]], path: Path, title: str) -> None:
    """The share of each strategy among the planner's choices at the first and at the
    last logged step, as grouped bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logged = [h for h in history if "strategies/terminal" in h]
    if not logged:
        return
    first, last = logged[0], logged[-1]
    x = range(len(STRATEGY_NAMES))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for offset, row, label in ((-0.2, first, "start"), (0.2, last, "end")):
        shares = [row.get(f"strategies/{name}", 0.0) for name in STRATEGY_NAMES]
        ax.bar([i + offset for i in x], shares, width=0.4, label=f"{label} (step {row['step']})")
    ax.set_xticks(list(x), STRATEGY_NAMES, rotation=30, ha="right")
    ax.set_ylabel("share of chosen strategies")
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
