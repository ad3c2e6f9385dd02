"""rSIM's training rules without a trainer: the λ schedule, what is read of an episode,
and the planner's clipped loss, against values worked out by hand."""

from __future__ import annotations

import pytest
import torch

from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.errors import UserError
from collabrl.protocols.strategies import PlannerContext
from collabrl.protocols.strategy import guided_steps, strategy_extras
from collabrl.train.rsim import (
    agent_lr_factors,
    end_shares,
    guided_token_counts,
    planner_clip_loss,
    planner_steps,
    planner_token_weights,
    planner_weight,
    without_failed,
)
from collabrl.train.rsim_config import RSIMConfig


@pytest.mark.parametrize(
    ("config", "max_steps", "expected"),
    [
        # N = half the run, rounded up: steps 1-3 of 5 are the planner's stage.
        (RSIMConfig(), 5, [0.7, 0.7, 0.7, 0.3, 0.3]),
        (RSIMConfig(lambda_switch_step=1), 3, [0.7, 0.3, 0.3]),
        (RSIMConfig(lambda_first=1.0, lambda_after=0.0, lambda_switch_step=2), 4, [1, 1, 0, 0]),
        (RSIMConfig(train="planner"), 3, [1.0, 1.0, 1.0]),
        (RSIMConfig(train="reasoner"), 3, [0.0, 0.0, 0.0]),
    ],
)
def test_the_two_stage_lambda_schedule(config, max_steps, expected) -> None:
    got = [planner_weight(step, config, max_steps) for step in range(1, max_steps + 1)]
    assert got == expected


def test_steps_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        planner_weight(0, RSIMConfig(), 4)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"train": "both"}, "rsim.train"),
        ({"lambda_first": 1.5}, "rsim.lambda_first"),
        ({"lambda_after": -0.1}, "rsim.lambda_after"),
        ({"lambda_switch_step": -1}, "rsim.lambda_switch_step"),
        ({"planner_learning_rate": 0.0}, "rsim.planner_learning_rate"),
        ({"planner_chunk": 0}, "rsim.planner_chunk"),
    ],
)
def test_bad_settings_are_refused(changes, fragment) -> None:
    with pytest.raises(UserError, match=fragment):
        RSIMConfig(**changes).check()


def _guidance(strategy: str, index: int, logprob: float, text: str) -> Segment:
    meta = {"strategy": strategy, "index": index, "logprob": logprob}
    return Segment(Author.GUIDANCE, text, [1], None, meta)


def _episode() -> Episode:
    meta = {"question": "What is 2 + 3 * 4?", "summary_chars": 0, "protocol": "strategy"}
    episode = Episode("p1", [5, 6], meta=meta)
    episode.meta["strategies"] = ["decomposition", "validation", "terminal"]
    episode.add(_guidance("decomposition", 1, -2.0, "Breaking the problem into smaller parts,"))
    episode.add(Segment(Author.POLICY, " first 3 * 4 = 12.\n\n", [7, 8], None, {}))
    episode.add(_guidance("validation", 3, -1.5, "To verify the result so far,"))
    episode.add(Segment(Author.POLICY, " we add: 2 + 12 = 14.\n\n", [9], None, {}))
    episode.add(_guidance("terminal", 8, -0.5, "So the final answer is"))
    episode.add(Segment(Author.POLICY, " \\boxed{14}.", [10], None, {}))
    episode.end = EndReason.TERMINAL
    return episode


def test_planner_steps_are_what_the_planner_saw_and_chose() -> None:
    steps = planner_steps(_episode())
    question = "What is 2 + 3 * 4?"
    assert steps.contexts == [
        PlannerContext(question),
        PlannerContext(question, ("first 3 * 4 = 12.",)),
        PlannerContext(question, ("first 3 * 4 = 12.", "we add: 2 + 12 = 14.")),
    ]
    assert steps.actions == [1, 3, 8]
    assert steps.old_logps == [-2.0, -1.5, -0.5]
    assert steps.tokens == [2, 1, 1]  # the reasoner tokens each decision guided


def test_guided_token_counts_skip_what_comes_before_the_first_guidance() -> None:
    episode = _episode()
    episode.segments.insert(0, Segment(Author.POLICY, " Hm.", [3, 4, 5], None, {}))
    assert guided_token_counts(episode) == [2, 1, 1]


def test_a_prompted_planner_episode_cannot_train_a_planner() -> None:
    episode = _episode()
    del episode.segments[0].meta["logprob"]
    with pytest.raises(ValueError, match="only an rsim planner"):
        planner_steps(episode)


def test_follow_and_format_read_the_reasoner_text_of_each_guided_step() -> None:
    episode = _episode()
    assert guided_steps(episode) == [
        ("decomposition", " first 3 * 4 = 12.\n\n"),
        ("validation", " we add: 2 + 12 = 14.\n\n"),
        ("terminal", " \\boxed{14}."),
    ]
    extras = strategy_extras(episode)
    # "first" marks a decomposition and \boxed{} an answer; "we add" checks nothing.
    assert extras == {
        "strategies": ["decomposition", "validation", "terminal"],
        "follow": pytest.approx(2 / 3),
        "step_format": 1.0,
        "eos_continued": 0,
    }


def test_the_planner_clip_loss_by_hand() -> None:
    # Ratios e^0 = 1, e^0.5 ≈ 1.6487 (clipped to 1.28 for A > 0), e^-1 ≈ 0.3679 (clipped
    # to 0.8 for A < 0: min(0.3679 * -1, 0.8 * -1) = -0.8).
    new = torch.tensor([0.0, 0.5, -1.0])
    old = torch.zeros(3)
    advantages = torch.tensor([2.0, 1.0, -1.0])
    loss, clipped = planner_clip_loss(new, old, advantages, 0.2, 0.28, torch.full((3,), 1 / 3))
    assert loss.item() == pytest.approx(-(2.0 + 1.28 - 0.8) / 3)
    weighted, _ = planner_clip_loss(new, old, advantages, 0.2, 0.28, torch.tensor([0.5, 0, 0.5]))
    assert weighted.item() == pytest.approx(-(2.0 - 0.8) / 2)
    assert clipped.item() == pytest.approx(2 / 3)


def test_the_planner_clip_loss_gradient_is_the_policy_gradient_at_ratio_one() -> None:
    new = torch.tensor([-1.0, -2.0], requires_grad=True)
    half = torch.full((2,), 0.5)
    loss, _ = planner_clip_loss(new, new.detach(), torch.tensor([1.0, -0.5]), 0.2, 0.2, half)
    loss.backward()
    # d/dlogp of -mean(ratio * A) at ratio 1 is -A / 2.
    assert new.grad.tolist() == pytest.approx([-0.5, 0.25])


def test_a_decision_weighs_by_the_tokens_it_guided_averaged_per_sample() -> None:
    # Sample 1: decisions guiding 3 and 1 tokens; sample 2: one decision, 2 tokens.
    # §4: 1/G Σ_j 1/|o_j| Σ_t, so 3/4/2, 1/4/2 and 2/2/2.
    assert planner_token_weights([[3, 1], [2]]) == pytest.approx([3 / 8, 1 / 8, 1 / 2])
    # A sample whose steps guided no token adds nothing (and no division by zero).
    assert planner_token_weights([[0, 0], [4]]) == [0.0, 0.0, 0.5]
    assert sum(planner_token_weights([[1, 2, 3], [5], [7, 1]])) == pytest.approx(1.0)


def test_lambda_scales_the_two_agents_learning_rates() -> None:
    config = RSIMConfig(lambda_switch_step=2)
    rates = [agent_lr_factors(step, config, 4) for step in (1, 2, 3, 4)]
    assert [r.planner for r in rates] == pytest.approx([0.7, 0.7, 0.3, 0.3])
    assert [r.reasoner for r in rates] == pytest.approx([0.3, 0.3, 0.7, 0.7])
    only_planner = agent_lr_factors(1, RSIMConfig(train="planner"), 4)
    assert (only_planner.planner, only_planner.reasoner) == (1.0, 0.0)


def test_end_shares_count_every_reason_and_sum_to_one() -> None:
    shares = end_shares(["terminal", "terminal", "length", "max_steps"])
    assert shares == {
        "terminal": 0.5,
        "eos": 0.0,
        "max_steps": 0.25,
        "length": 0.25,
        "empty": 0.0,
        "error": 0.0,
    }
    assert set(end_shares([]).values()) == {0.0}
    assert end_shares(["error"])["error"] == 1.0  # a failed episode (issue 33) is counted
    with pytest.raises(ValueError, match="turn_budget"):
        end_shares(["turn_budget"])


def test_a_failed_episode_teaches_the_planner_nothing() -> None:
    """An ERROR episode's decisions get advantage 0; the others keep theirs."""
    ends = [EndReason.EOS, EndReason.ERROR, EndReason.LENGTH]
    episodes = [Episode(f"p{i}", [1], end=end) for i, end in enumerate(ends)]
    assert without_failed([0.5, -1.5, 1.0], episodes) == [0.5, 0.0, 1.0]
