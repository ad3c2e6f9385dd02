"""The strategy planners: the rSIM action-head planner and the prompted-LLM planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from collabrl.config import EngineConfig
from collabrl.engines import create_engine
from collabrl.engines.base import SamplingParams
from collabrl.episode import Author
from collabrl.errors import UserError
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.planner import (
    PLANNER_FILE,
    PromptingPlanner,
    RSIMPlanner,
    load_planner,
    parse_strategy,
    planner_messages,
    planner_text,
    sample_rows,
)
from collabrl.protocols.strategies import PlannerContext
from collabrl.protocols.strategy import StrategyConfig, StrategyProtocol
from collabrl.strategies import CONTINUATION, STRATEGY_NAMES
from tests.protocols.scripted import ScriptedEngine
from tests.saved_activations import SavedActivations
from tests.servers import ServerProcess

CONTEXTS = [
    PlannerContext("What is 2+3?"),
    PlannerContext("What is 7*6?", ("First, 7*6 is 7 sixes.", "That is 42.")),
    PlannerContext("A much longer question about a train that leaves a station at noon."),
]


@pytest.fixture(scope="module")
def planner(tiny_model_dir: Path) -> RSIMPlanner:
    return RSIMPlanner.from_ref(str(tiny_model_dir), temperature=1.0, head_seed=0)


# ----------------------------------------------------------------------------- rsim


def test_planner_text_ends_where_the_choice_is_made() -> None:
    assert planner_text(CONTEXTS[1]) == (
        "Question: What is 7*6?\nStep 1: First, 7*6 is 7 sixes.\nStep 2: That is 42.\n"
        "Next strategy:"
    )


def test_head_reads_the_hidden_state_into_nine_actions(planner: RSIMPlanner) -> None:
    hidden = planner.backbone.config.hidden_size
    assert tuple(planner.head.weight.shape) == (9, hidden)
    input_ids, mask = planner.encode(CONTEXTS)
    assert mask[0, 0] == 0 and mask[:, -1].all()  # left padding: the last position is real
    assert tuple(planner(input_ids, mask).shape) == (3, 9)


def test_a_context_scores_the_same_alone_or_in_a_padded_batch(planner: RSIMPlanner) -> None:
    with torch.no_grad():
        batched = planner.logits(CONTEXTS)
        alone = torch.cat([planner.logits([c]) for c in CONTEXTS])
    torch.testing.assert_close(batched, alone, atol=1e-4, rtol=1e-4)


def test_argmax_at_temperature_zero_is_deterministic(tiny_model_dir: Path) -> None:
    greedy = RSIMPlanner.from_ref(str(tiny_model_dir), temperature=0.0)
    first = greedy.choose(CONTEXTS, seeds=(1, 1, 1))
    assert [c.index for c in first] == [c.index for c in greedy.choose(CONTEXTS, seeds=(2, 2, 2))]
    with torch.no_grad():
        assert [c.index for c in first] == greedy.logits(CONTEXTS).argmax(-1).tolist()


def test_sampling_is_reproducible_with_a_seed(planner: RSIMPlanner) -> None:
    many = CONTEXTS * 8
    seeds = tuple(range(5, 5 + len(many)))
    first = planner.choose(many, seeds=seeds)
    assert first == planner.choose(many, seeds=seeds)
    assert all(0 <= c.index < 9 and abs(sum(c.probs) - 1) < 1e-5 for c in first)
    assert planner.choose([]) == []


def test_each_draw_depends_on_its_own_seed_not_on_its_row(planner: RSIMPlanner) -> None:
    contexts, seeds = CONTEXTS * 4, tuple(range(100, 112))
    drawn = planner.choose(contexts, seeds=seeds)
    reversed_ = planner.choose(contexts[::-1], seeds=seeds[::-1])[::-1]
    assert [c.index for c in drawn] == [c.index for c in reversed_]
    uniform = torch.full((64, 9), 1 / 9)
    assert len(set(sample_rows(uniform, [7] * 64).tolist())) == 1  # one seed, one draw
    assert len(set(sample_rows(uniform, range(64)).tolist())) > 1
    with pytest.raises(ValueError, match="one per context"):
        sample_rows(uniform, (1, 2))


def test_the_head_is_seeded_and_leaves_the_global_rng_alone(tiny_model_dir: Path) -> None:
    state = torch.random.get_rng_state()
    a = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=7)
    assert torch.equal(state, torch.random.get_rng_state())
    b = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=7)
    c = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=8)
    assert torch.equal(a.head.weight, b.head.weight)
    assert not torch.equal(a.head.weight, c.head.weight)


def test_log_probs_match_the_sampling_distribution_and_train(planner: RSIMPlanner) -> None:
    choices = planner.choose(CONTEXTS, seeds=(0, 1, 2))
    actions = [c.index for c in choices]
    logp = planner.action_log_probs(planner.logits(CONTEXTS), actions)
    expected = torch.tensor([c.probs[c.index] for c in choices]).log()
    torch.testing.assert_close(logp.detach(), expected, atol=1e-5, rtol=1e-5)
    # The recorded log-prob is the old log-prob of the policy-gradient ratio.
    recorded = torch.tensor([c.logprob for c in choices])
    torch.testing.assert_close(logp.detach(), recorded, atol=1e-5, rtol=1e-5)
    planner.zero_grad()
    (-logp.sum()).backward()
    assert planner.head.weight.grad is not None and planner.head.weight.grad.abs().sum() > 0
    planner.zero_grad()


def _planner_pass(planner: RSIMPlanner) -> tuple[int, list[torch.Tensor]]:
    """Peak bytes kept for backward by the log-probs of CONTEXTS, and the gradients."""
    planner.zero_grad()
    with SavedActivations(planner) as saved:
        planner.action_log_probs(planner.logits(CONTEXTS), [0, 4, 8]).sum().backward()
    grads = [p.grad.clone() for p in planner.parameters() if p.grad is not None]
    planner.zero_grad()
    return saved.peak, grads


def test_checkpointed_layers_keep_less_and_give_the_same_gradients(tiny_model_dir: Path) -> None:
    from transformers.modeling_layers import GradientCheckpointingLayer

    plain = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=0).eval()
    checkpointed = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=0).eval()
    checkpointed.checkpoint_layers()
    layers = [m for m in checkpointed.modules() if isinstance(m, GradientCheckpointingLayer)]
    assert layers and all(m.training for m in layers)  # what makes transformers checkpoint
    others = [m for m in checkpointed.modules() if not isinstance(m, GradientCheckpointingLayer)]
    assert not any(m.training for m in others)  # no dropout: the first ratio stays 1
    full, expected = _planner_pass(plain)
    kept, grads = _planner_pass(checkpointed)
    assert kept < full / 2
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_save_and_load_restore_identical_logits(tiny_model_dir: Path, tmp_path: Path) -> None:
    planner = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=1)
    with torch.no_grad():
        planner.head.bias.add_(torch.arange(9.0))  # a head no fresh seed would produce
        expected = planner.logits(CONTEXTS)
    planner.save(tmp_path / "ref")
    meta = json.loads((tmp_path / "ref" / PLANNER_FILE).read_text())
    assert meta["strategies"] == list(STRATEGY_NAMES) and not meta["backbone_saved"]
    assert meta["hidden_size"] == planner.head.in_features
    planner.save(tmp_path / "full", with_backbone=True)
    assert (tmp_path / "full" / "backbone" / "config.json").is_file()
    for folder in ("ref", "full"):
        loaded = RSIMPlanner.load(tmp_path / folder)
        with torch.no_grad():
            torch.testing.assert_close(loaded.logits(CONTEXTS), expected, atol=0, rtol=0)


def test_a_folder_with_other_strategies_is_refused(planner: RSIMPlanner, tmp_path: Path) -> None:
    planner.save(tmp_path)
    meta = json.loads((tmp_path / PLANNER_FILE).read_text())
    meta["strategies"] = meta["strategies"][:-1]
    (tmp_path / PLANNER_FILE).write_text(json.dumps(meta))
    with pytest.raises(UserError, match="other strategies"):
        RSIMPlanner.load(tmp_path)
    (tmp_path / PLANNER_FILE).write_text("{}")
    with pytest.raises(UserError, match="not a planner description"):
        RSIMPlanner.load(tmp_path)


def test_a_planner_without_a_backbone_reference_saves_its_backbone(
    planner: RSIMPlanner, tmp_path: Path
) -> None:
    bare = RSIMPlanner(planner.backbone, planner.tokenizer)
    with pytest.raises(ValueError, match="with_backbone"):
        bare.save(tmp_path)


def test_load_planner_from_a_reference(
    planner: RSIMPlanner, tiny_model_dir: Path, tmp_path
) -> None:
    engine = EngineConfig()
    fresh = load_planner(str(tiny_model_dir), "rsim", 0.0, 3, engine)
    assert isinstance(fresh, RSIMPlanner) and fresh.temperature == 0.0
    planner.save(tmp_path)
    saved = load_planner(str(tmp_path), "rsim", 0.0, 3, engine)
    assert torch.equal(saved.head.weight, planner.head.weight)
    with pytest.raises(UserError, match="in-process"):
        load_planner("http://127.0.0.1:9/v1", "rsim", 0.0, 3, engine)
    prompting = load_planner(str(tiny_model_dir), "prompting", 0.0, 0, engine)
    assert isinstance(prompting, PromptingPlanner)
    prompting.close()


# ----------------------------------------------------------------------------- prompting


@pytest.mark.parametrize(
    ("reply", "index"),
    [
        ("validation", 3),
        ("  Self-Reflection.", 0),
        ("self reflection", 0),
        ("SUB_PLANNING", 7),
        ("Deep-thinking is best here", 2),
        ("deliberative thinking", 2),
        ("Termination", 8),
        ("4", 3),
        ("Strategy 9.", 8),
        ("3. validation", 3),
        ("I pick decomposition, not validation", 1),
        ("The sum is 12; use summarization", 4),
        ("10", None),
        ("0.5", None),
        ("banana", None),
        ("", None),
    ],
)
def test_parse_strategy(reply: str, index: int | None) -> None:
    assert parse_strategy(reply) == index


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parse_strategy_is_total_over_any_reply(reply: str) -> None:
    assert parse_strategy(reply) in (None, *range(9))


def test_planner_prompt_lists_the_question_steps_and_strategies() -> None:
    [system, user] = planner_messages(CONTEXTS[1])
    assert system["role"] == "system" and user["role"] == "user"
    text = user["content"]
    assert "What is 7*6?" in text and "Step 2: That is 42." in text
    assert all(f"{i}. {name}:" in text for i, name in enumerate(STRATEGY_NAMES, 1))
    assert "(none yet)" in planner_messages(CONTEXTS[0])[1]["content"]


def test_prompting_planner_parses_replies_and_records_failures(smol_tokenizer) -> None:
    engine = ScriptedEngine(smol_tokenizer, ["Validation.", "7", "no idea"])
    choices = PromptingPlanner(engine).choose(CONTEXTS)
    assert [c.index for c in choices] == [3, 6, CONTINUATION]
    assert [c.reply for c in choices] == ["Validation.", "7", "no idea"]
    assert choices[0].error is None and "names no strategy" in choices[2].error
    assert engine.prompts == [planner_messages(c) for c in CONTEXTS]  # one batched call


def test_unreachable_prompting_planner_means_continuation_with_the_error() -> None:
    from collabrl.engines.openai_http import OpenAIEngine
    from tests.servers import free_port

    engine = OpenAIEngine(f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=0)
    planner = PromptingPlanner(engine)
    choices = planner.choose([PlannerContext("What is 2+3?", ())] * 2)
    planner.close()
    assert [c.index for c in choices] == [STRATEGY_NAMES.index("continuation")] * 2
    assert all("planner unavailable" in c.error for c in choices)


def test_smollm2_prompting_planner_served_over_http(tiny_engine) -> None:
    with ServerProcess("smollm2-135m") as server:
        planner = PromptingPlanner(create_engine(server.url, EngineConfig()), max_tokens=8)
        policy = Policy(tiny_engine, tiny_engine.tokenizer, owns_engine=False)
        config = StrategyConfig(planner_kind="prompting", max_steps=2, step_max_tokens=6)
        protocol = StrategyProtocol(policy, planner, config)
        episodes = protocol.run([Task("a", "What is 2+3?")], SamplingParams(max_tokens=40))
        protocol.close()
    [episode] = episodes
    guidance = [s for s in episode.segments if s.author is Author.GUIDANCE]
    assert guidance and len(guidance) == len(episode.meta["strategies"])
    for segment in guidance:
        assert isinstance(segment.meta["reply"], str)  # what smollm2 answered, kept
        assert STRATEGY_NAMES[segment.meta["index"]] == segment.meta["strategy"]


def test_a_masked_strategy_is_never_chosen_and_has_no_probability(tiny_model_dir: Path) -> None:
    masked = tuple(range(8))  # only terminal (index 8) is left
    planner = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=0, masked=masked)
    choices = planner.choose(CONTEXTS * 4, seeds=tuple(range(12)))
    assert {c.index for c in choices} == {8}
    assert all(c.probs[8] == pytest.approx(1.0) for c in choices)
    assert all(c.logprob == pytest.approx(0.0) for c in choices)
    logp = planner.action_log_probs(planner.logits(CONTEXTS), [0, 3, 8])
    assert logp[:2].tolist() == [-torch.inf, -torch.inf] and logp[2].item() == pytest.approx(0.0)
