"""The strategy protocol (rSIM): keyword counting, f_obs, and the planner/reasoner rounds."""

from __future__ import annotations

import pytest

from collabrl.config import EngineConfig
from collabrl.engines.base import SamplingParams
from collabrl.episode import Author, Episode
from collabrl.errors import UserError
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.planner import PlannerChoice, RSIMPlanner, planner_text
from collabrl.protocols.strategies import PlannerContext, observe_step
from collabrl.protocols.strategy import (
    PS_PLUS_TRIGGER,
    StrategyConfig,
    StrategyProtocol,
    planner_context_tokens,
    planner_contexts,
)
from collabrl.strategies import (
    KEYWORDS,
    STRATEGIES,
    STRATEGY_NAMES,
    TERMINAL,
    count_strategies,
)
from tests.protocols.scripted import RecordingEngine, ScriptedEngine

QUESTION = "What is 2+3?"
TASKS = [Task("a", QUESTION), Task("b", "What is 7*6?")]
INDEX = {name: i for i, name in enumerate(STRATEGY_NAMES)}

# ----------------------------------------------------------------------------- the strategy set


def test_nine_strategies_in_the_papers_order_with_guidance() -> None:
    assert STRATEGY_NAMES == (
        "self-reflection",
        "decomposition",
        "deep thinking",
        "validation",
        "summarization",
        "prioritization",
        "continuation",
        "sub-planning",
        "terminal",
    )
    assert STRATEGY_NAMES[TERMINAL] == "terminal"
    assert all(s.guidance and s.description for s in STRATEGIES)
    # Keyword lists exist for the seven counted strategies only (appendix A.2).
    assert set(KEYWORDS) == set(STRATEGY_NAMES) - {"continuation", "terminal"}


# ----------------------------------------------------------------------------- count_strategies


def _counted(text: str) -> set[str]:
    return {name for name, n in count_strategies(text).items() if n}


def test_counts_have_the_seven_strategies_and_start_at_zero() -> None:
    assert count_strategies("") == dict.fromkeys(KEYWORDS, 0)
    assert list(count_strategies("")) == [n for n in STRATEGY_NAMES if n in KEYWORDS]


def test_a_step_counts_once_per_strategy_and_steps_split_on_blank_lines() -> None:
    text = "Verify it, then check and confirm.\nTest again.\n\nWe verify once more.\n\n2+3=5"
    assert count_strategies(text)["validation"] == 2  # three steps, two use validation


def test_a_keyword_shared_by_strategies_counts_for_each() -> None:
    assert _counted("Let me analyze the terms.") == {
        "self-reflection",
        "decomposition",
        "deep thinking",
    }


@pytest.mark.parametrize(
    ("text", "strategy"),
    [
        ("The sum was verified.", "validation"),
        ("A quick verification shows it.", "validation"),
        ("VALIDATION passes.", "validation"),
        ("I double-checked the sum.", "validation"),
        ("We cross-checked the sum.", "self-reflection"),
        ("Breaking down the sum into parts.", "decomposition"),
        ("The decomposition gives 2 and 3.", "decomposition"),
        ("I planned ahead.", "sub-planning"),
        ("Planning the next move.", "sub-planning"),
        ("Summarising: 5.", "summarization"),
        ("In summarization, 5.", "summarization"),
        ("We chose the larger one.", "prioritization"),
        ("Focusing on the units digit.", "prioritization"),
        ("After some reasoning, 5.", "deep thinking"),
        ("The rule simplifies things.", "summarization"),
        ("I rethought the carry.", "self-reflection"),
    ],
)
def test_inflections_match(text: str, strategy: str) -> None:
    assert strategy in _counted(text)


@pytest.mark.parametrize(
    "text",
    [
        "The planet is far.",  # plan
        "A checkpoint was saved.",  # check
        "The contest ended.",  # test
        "A reasonable guess.",  # reason
        "An analysis of it.",  # a derived word of another shape
        "The orderly queue.",  # order
    ],
)
def test_words_that_merely_contain_a_keyword_do_not_match(text: str) -> None:
    assert _counted(text) == set()


# ----------------------------------------------------------------------------- f_obs


def test_observe_step_collapses_whitespace_and_keeps_head_and_tail() -> None:
    assert observe_step("  First,\nadd   2 and 3.\n\n", 200) == "First, add 2 and 3."
    long = "start " + "x " * 200 + "so the result is 5"
    seen = observe_step(long, 40)
    assert len(seen) <= 40
    assert seen.startswith("start") and seen.endswith("result is 5") and " … " in seen
    assert observe_step(long, 0) == " ".join(long.split())


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"planner_kind": "oracle"}, "unknown planner kind"),
        ({"max_steps": 0}, "max_steps"),
        ({"step_max_tokens": 0}, "step_max_tokens"),
        ({"planner_temperature": -1.0}, "planner_temperature"),
        ({"summary_chars": 3}, "summary_chars"),
        ({"masked": ["guessing"]}, "unknown strategies: guessing"),
        ({"masked": ["validation"], "planner_kind": "prompting"}, "applies to the rsim planner"),
        ({"masked": list(STRATEGY_NAMES)}, "all nine"),
        ({"end": "never"}, "unknown strategy.end 'never'"),
    ],
)
def test_bad_configs_are_user_errors(changes: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        StrategyConfig(**changes).check()


def test_planner_kind_and_planner_must_agree(tiny_engine) -> None:
    policy = Policy(tiny_engine, tiny_engine.tokenizer, owns_engine=False)
    with pytest.raises(UserError, match="needs a planner"):
        StrategyProtocol(policy, None, StrategyConfig(planner_kind="rsim"))
    with pytest.raises(UserError, match="takes no planner"):
        StrategyProtocol(policy, FixedPlanner([0]), StrategyConfig(planner_kind="ps+"))


# ----------------------------------------------------------------------------- the rounds


class CountingEngine(RecordingEngine):
    """Records prompts, and how many went into each generate call."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.batches: list[int] = []

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        return super().generate(prompts, params)


class FixedPlanner:
    """A planner that plays a fixed sequence of strategies, and records what it saw."""

    def __init__(self, names_or_indices: list[str | int]) -> None:
        self.plan = [INDEX.get(x, x) for x in names_or_indices]
        self.seen: list[list[PlannerContext]] = []

    def choose(self, contexts: list[PlannerContext], seeds: tuple[int, ...] = ()):
        round_no = len(self.seen)
        self.seen.append(list(contexts))
        index = self.plan[min(round_no, len(self.plan) - 1)]
        return [PlannerChoice(index) for _ in contexts]

    def close(self) -> None:
        pass


def _protocol(engine, planner, **config) -> StrategyProtocol:
    policy = Policy(engine, engine.tokenizer, owns_engine=False)
    return StrategyProtocol(policy, planner, StrategyConfig(**config))


def _authors(episode: Episode) -> list[Author]:
    return [s.author for s in episode.segments]


def test_rounds_alternate_guidance_and_reasoner_with_token_continuity(tiny_engine) -> None:
    engine = CountingEngine(tiny_engine)
    planner = FixedPlanner(["decomposition", "validation", "summarization"])
    protocol = _protocol(engine, planner, max_steps=3, step_max_tokens=6)
    episodes = protocol.run(TASKS, SamplingParams(max_tokens=200, seed=0))

    assert engine.batches == [2, 2, 2]  # one batched reasoner call per round, for both episodes
    for episode in episodes:
        assert _authors(episode) == [Author.GUIDANCE, Author.POLICY] * 3
        assert episode.meta["strategies"] == ["decomposition", "validation", "summarization"]
        assert episode.end == "max_steps"
        mask = episode.loss_mask()
        for segment, start in _segment_starts(episode):
            assert set(mask[start : start + len(segment.token_ids)]) == {
                int(segment.author is Author.POLICY)
            }
        guidance = [s for s in episode.segments if s.author is Author.GUIDANCE]
        assert [(g.meta["strategy"], g.meta["index"]) for g in guidance] == [
            ("decomposition", 1),
            ("validation", 3),
            ("summarization", 4),
        ]
        for g in guidance:
            assert g.token_ids == protocol.policy.encode(g.text)
    # What the reasoner received each round is the prompt and every segment so far.
    for round_no in range(3):
        for k, episode in enumerate(episodes):
            sent = engine.prompts[2 * round_no + k]
            before = episode.segments[: 2 * round_no + 1]
            assert sent == episode.prompt_ids + [t for s in before for t in s.token_ids]


def _segment_starts(episode: Episode):
    start = 0
    for segment in episode.segments:
        yield segment, start
        start += len(segment.token_ids)


def test_every_step_starts_on_a_new_paragraph(tiny_engine) -> None:
    # The tiny model never writes "\n\n": each step is cut by step_max_tokens, and the
    # next guidance opens a paragraph of its own.
    planner = FixedPlanner(["continuation"])
    [episode] = _protocol(tiny_engine, planner, max_steps=3, step_max_tokens=5).run(
        TASKS[:1], SamplingParams(max_tokens=200)
    )
    text = ""
    for segment in episode.segments:
        if segment.author is Author.GUIDANCE:
            lead = STRATEGIES[segment.meta["index"]].guidance
            if not text:
                assert segment.text == lead
            else:
                assert segment.text in (lead, "\n" + lead, "\n\n" + lead)
                assert (text + segment.text).endswith("\n\n" + lead)
        text += segment.text


def test_terminal_writes_one_last_step_past_blank_lines(smol_tokenizer) -> None:
    engine = ScriptedEngine(
        smol_tokenizer,
        [" 2 plus 3 is 5.\n\nThis never shows.", " \\boxed{5}.\n\nThat is all."],
    )
    planner = FixedPlanner(["decomposition", "terminal"])
    [episode] = _protocol(engine, planner, max_steps=5).run(
        TASKS[:1], SamplingParams(max_tokens=200)
    )
    assert episode.meta["strategies"] == ["decomposition", "terminal"]
    assert episode.end == "terminal"
    assert _authors(episode) == [Author.GUIDANCE, Author.POLICY] * 2
    first, last = episode.segments[1], episode.segments[3]
    assert first.text == " 2 plus 3 is 5.\n\n" and first.meta["stop_reason"] == "\n\n"
    assert last.text == " \\boxed{5}.\n\nThat is all."  # no step stop in the final step
    assert episode.segments[2].text == STRATEGIES[TERMINAL].guidance
    assert episode.answer == "5"
    assert len(planner.seen) == 2


def test_guidance_is_neither_counted_nor_read_for_the_answer(smol_tokenizer) -> None:
    engine = ScriptedEngine(smol_tokenizer, [" 5\n\n", " 6\n\n"])
    planner = FixedPlanner(["validation", "summarization"])
    [episode] = _protocol(engine, planner, max_steps=2).run(
        TASKS[:1], SamplingParams(max_tokens=200)
    )
    assert episode.end == "max_steps"
    # "verify" and "summarize" are in the guidance, not in the reasoner's text.
    assert sum(episode.meta["strategy_counts"].values()) == 0
    assert episode.answer is None


def test_a_step_cut_by_its_token_limit_still_counts_as_a_step(smol_tokenizer) -> None:
    replies = [" We verify it and carry on for a while longer", " We check it.\n\n"]
    planner = FixedPlanner(["continuation"])
    [episode] = _protocol(
        ScriptedEngine(smol_tokenizer, replies), planner, max_steps=2, step_max_tokens=6
    ).run(TASKS[:1], SamplingParams(max_tokens=200))
    first, second = (s for s in episode.segments if s.author is Author.POLICY)
    assert first.meta["finish_reason"] == "length" and not first.text.endswith("\n")
    assert second.text == " We check it.\n\n"
    assert episode.meta["strategy_counts"]["validation"] == 2


def test_under_end_eos_the_reasoners_eos_ends_the_episode(smol_tokenizer) -> None:
    engine = ScriptedEngine(smol_tokenizer, [" It is \\boxed{5}."])  # no blank line: EOS
    planner = FixedPlanner(["deep thinking"])
    [episode] = _protocol(engine, planner, max_steps=5, end="eos").run(
        TASKS[:1], SamplingParams(max_tokens=200)
    )
    assert episode.end == "eos" and episode.answer == "5"
    assert len(planner.seen) == 1
    assert episode.meta["end_mode"] == "eos" and episode.meta["eos_continued"] == 0


def test_the_default_reading_is_algorithm_1() -> None:
    # Only the planner's terminal ends an episode (besides max_steps and the budget).
    assert StrategyConfig().end == "terminal"


def test_under_end_terminal_an_eos_asks_the_planner_again(smol_tokenizer) -> None:
    replies = [" It is \\boxed{5}.", " We check: 2+3=5.\n\n", " \\boxed{5}."]
    engine = ScriptedEngine(smol_tokenizer, replies)
    planner = FixedPlanner(["deep thinking", "validation", "terminal"])
    [episode] = _protocol(engine, planner, max_steps=5, end="terminal").run(
        TASKS[:1], SamplingParams(max_tokens=200)
    )
    eos = smol_tokenizer.eos_token_id
    assert episode.end == "terminal" and len(planner.seen) == 3
    assert episode.meta["strategies"] == ["deep thinking", "validation", "terminal"]
    assert episode.meta["eos_continued"] == 1
    first, second, last = (s for s in episode.segments if s.author is Author.POLICY)
    # The overridden step keeps its text, loses its EOS, and the next guidance opens a
    # paragraph of its own.
    assert first.text == " It is \\boxed{5}." and first.meta["eos_dropped"]
    assert eos not in first.token_ids
    assert episode.segments[2].text.startswith("\n\n")
    # The reasoner was never conditioned on an EOS mid-answer; its final step ends on one.
    assert all(eos not in prompt[len(episode.prompt_ids) :] for prompt in engine.prompts)
    assert last.token_ids[-1] == eos and "eos_dropped" not in last.meta
    assert episode.answer == "5"


def test_under_end_terminal_max_steps_and_the_budget_still_end_episodes(smol_tokenizer) -> None:
    always_eos = ScriptedEngine(smol_tokenizer, lambda prompt: " 5.")
    planner = FixedPlanner(["continuation"])
    [episode] = _protocol(always_eos, planner, max_steps=3, end="terminal").run(
        TASKS[:1], SamplingParams(max_tokens=200)
    )
    assert episode.end == "max_steps" and episode.meta["eos_continued"] == 3
    assert len(planner.seen) == 3
    # A budget that runs out before max_steps: every step ended at EOS, none ended it.
    [short] = _protocol(always_eos, FixedPlanner(["continuation"]), max_steps=50).run(
        TASKS[:1], SamplingParams(max_tokens=20)
    )
    assert short.end == "length" and short.meta["eos_continued"] >= 2
    assert len(short.response_ids) <= 20


def test_token_budget_bounds_the_whole_episode(tiny_engine) -> None:
    planner = FixedPlanner(["self-reflection"])
    episodes = _protocol(tiny_engine, planner, max_steps=12, step_max_tokens=7).run(
        TASKS, SamplingParams(max_tokens=40)
    )
    for episode in episodes:
        assert episode.end == "length"
        assert len(episode.response_ids) <= 40
        assert _authors(episode)[-1] is Author.POLICY  # guidance never ends an episode


def test_a_budget_smaller_than_the_first_guidance_gives_an_empty_episode(tiny_engine) -> None:
    planner = FixedPlanner(["self-reflection"])  # its guidance is a dozen tokens
    [episode] = _protocol(tiny_engine, planner).run(TASKS[:1], SamplingParams(max_tokens=3))
    assert episode.segments == [] and episode.end == "empty"
    assert episode.meta["end_before_empty"] == "length"


def test_episodes_record_what_a_trainer_needs_to_rebuild_the_planner_ratios(
    tiny_engine, tiny_model_dir
) -> None:
    planner = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=0, temperature=0.7)
    config = {"max_steps": 3, "step_max_tokens": 6, "summary_chars": 12, "planner_temperature": 0.7}
    [episode] = _protocol(tiny_engine, planner, **config).run(
        TASKS[:1], SamplingParams(max_tokens=60, seed=2)
    )
    assert episode.meta["planner_temperature"] == 0.7 and episode.meta["summary_chars"] == 12
    guidance = [s for s in episode.segments if s.author is Author.GUIDANCE]
    actions = [s.meta["index"] for s in guidance]
    recomputed = planner.action_log_probs(
        planner.logits(planner_contexts(episode)), actions
    ).tolist()
    assert recomputed == pytest.approx([s.meta["logprob"] for s in guidance], abs=1e-5)


def test_the_planner_sees_the_question_and_finished_steps_only(smol_tokenizer) -> None:
    steps = [" First we add.\n\n", " Then we check.\n\n", " \\boxed{5}"]
    planner = FixedPlanner(["decomposition", "validation", "terminal"])
    [episode] = _protocol(
        ScriptedEngine(smol_tokenizer, list(steps)), planner, summary_chars=10
    ).run(TASKS[:1], SamplingParams(max_tokens=200))
    seen = [contexts[0] for contexts in planner.seen]
    assert seen == [
        PlannerContext(QUESTION, ()),
        PlannerContext(QUESTION, (observe_step(steps[0], 10),)),
        PlannerContext(QUESTION, (observe_step(steps[0], 10), observe_step(steps[1], 10))),
    ]
    assert planner_contexts(episode) == seen  # what a trainer rebuilds from the episode


def test_rsim_planner_runs_are_reproducible_with_a_seed(tiny_engine, tiny_model_dir) -> None:
    planner = RSIMPlanner.from_ref(str(tiny_model_dir), temperature=1.0)
    protocol = _protocol(tiny_engine, planner, max_steps=3, step_max_tokens=4)
    params = SamplingParams(max_tokens=100, temperature=1.0, seed=3)
    first, second = protocol.run(TASKS, params), protocol.run(TASKS, params)
    assert [e.to_dict() for e in first] == [e.to_dict() for e in second]
    for episode in first:
        for g in (s for s in episode.segments if s.author is Author.GUIDANCE):
            assert len(g.meta["probs"]) == 9 and abs(sum(g.meta["probs"]) - 1) < 1e-5


def _drawn(smol_tokenizer, planner, tasks: list[Task]) -> dict[tuple[str, int], list[str]]:
    """The strategies of each episode (by problem and sample) of one seeded run, with a
    reasoner that writes the same step every time: only the planner's draws differ."""
    engine = ScriptedEngine(smol_tokenizer, lambda prompt: " We add the numbers.\n\n")
    protocol = _protocol(engine, planner, max_steps=3, step_max_tokens=8)
    params = SamplingParams(max_tokens=200, temperature=1.0, seed=4)
    return {
        (e.problem_id, e.meta["sample"]): e.meta["strategies"] for e in protocol.run(tasks, params)
    }


def test_planner_draws_differ_across_processes_and_problems(smol_tokenizer, tiny_model_dir) -> None:
    planner = RSIMPlanner.from_ref(str(tiny_model_dir), temperature=1.0, head_seed=0)
    # Two processes holding samples 0-7 and 8-15 of one problem's group (TRL splits a
    # group so), under the run's one seed: a seed per batch drew the same strategies on
    # both (their contexts are alike), and so did two batches of different problems.
    first = _drawn(smol_tokenizer, planner, [Task("a", QUESTION, s) for s in range(8)])
    other = _drawn(smol_tokenizer, planner, [Task("a", QUESTION, s) for s in range(8, 16)])
    problem = _drawn(smol_tokenizer, planner, [Task("b", QUESTION, s) for s in range(8)])
    assert list(first.values()) != list(other.values())
    assert list(first.values()) != list(problem.values())


def test_a_planner_draw_is_the_episodes_wherever_it_sits_in_a_batch(
    smol_tokenizer, tiny_model_dir
) -> None:
    planner = RSIMPlanner.from_ref(str(tiny_model_dir), temperature=1.0, head_seed=0)
    tasks = [Task(problem, QUESTION, s) for problem in "ab" for s in range(3)]
    forward = _drawn(smol_tokenizer, planner, tasks)
    assert forward == _drawn(smol_tokenizer, planner, tasks[::-1])
    assert len({tuple(v) for v in forward.values()}) > 1  # the draws do differ


def test_the_planner_context_estimate_holds_a_full_maths_context(smol_tokenizer) -> None:
    step = (
        "We compute $\\frac{3x^2+2}{7} = 14$, so $3x^2 = 96$ and $x^2 = 32$, hence "
        "$x = \\pm 4\\sqrt{2}$. Checking: $3 \\cdot 32 + 2 = 98$, which holds. " * 3
    )
    config = StrategyConfig()  # 12 strategies, steps cut to 200 characters
    steps = tuple(observe_step(step, config.summary_chars) for _ in range(config.max_steps - 1))
    text = planner_text(PlannerContext(QUESTION, steps))  # before the last decision
    question = len(smol_tokenizer(QUESTION)["input_ids"])
    tokens = len(smol_tokenizer(text)["input_ids"])
    assert tokens <= planner_context_tokens(config, question) < 1.5 * tokens
    whole = StrategyConfig(summary_chars=0, step_max_tokens=40, max_steps=3)
    assert planner_context_tokens(whole, 10) == 8 + 10 + 2 * (40 + 6)


def test_ps_plus_is_one_response_to_the_ps_plus_prompt(tiny_engine) -> None:
    protocol = _protocol(tiny_engine, None, planner_kind="ps+")
    [episode] = protocol.run(TASKS[:1], SamplingParams(max_tokens=12))
    assert _authors(episode) == [Author.POLICY]
    assert PS_PLUS_TRIGGER in tiny_engine.tokenizer.decode(episode.prompt_ids)
    assert episode.meta["protocol"] == "strategy" and episode.meta["planner"] == "ps+"
    assert episode.meta["strategies"] == [] and episode.end in ("eos", "length")
    assert set(episode.meta["strategy_counts"]) == set(KEYWORDS)


# ----------------------------------------------------------------------------- end to end


def test_smollm2_reasoner_with_a_smollm2_rsim_planner() -> None:
    policy = Policy.load("smollm2-135m", EngineConfig())
    planner = RSIMPlanner.from_ref("smollm2-135m", temperature=1.0, head_seed=0)
    config = StrategyConfig(max_steps=4, step_max_tokens=24)
    protocol = StrategyProtocol(policy, planner, config, extract_fallback=("last_number",))
    try:
        episodes = protocol.run(TASKS, SamplingParams(max_tokens=64, seed=0))
    finally:
        protocol.close()
    for episode in episodes:
        assert episode.end in ("terminal", "eos", "max_steps", "length")
        assert len(episode.response_ids) <= 64
        authors = _authors(episode)
        assert authors[0] is Author.GUIDANCE and authors[1] is Author.POLICY
        assert len(episode.meta["strategies"]) == authors.count(Author.GUIDANCE) <= 4
        first = STRATEGIES[episode.segments[0].meta["index"]]
        assert episode.segments[0].text == first.guidance
