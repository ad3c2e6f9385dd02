"""One mechanism per idea (protocols/base.py): a row's token budget travels in the
params (`SamplingParams.budgets`), and every random stream of an episode (the policy's
rounds, a planner's decisions, its collaborators' calls) is seeded by the episode alone,
so that it samples the same in a batch of one as in a batch of eight."""

from __future__ import annotations

import json
import re
from collections import defaultdict

from collabrl.config import PoolConfig
from collabrl.data.benchmarks import Item
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import Completion, Prompt, SamplingParams
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import REFERENCE, Reference
from collabrl.episode import Author, Episode, Segment
from collabrl.protocols.base import Policy, Task, policy_turn
from collabrl.protocols.consult import ConsultConfig, ConsultProtocol
from collabrl.protocols.parsing import AGENT_CALLS_CLOSE, AGENT_CALLS_OPEN
from collabrl.protocols.planner import PromptingPlanner, RSIMPlanner
from collabrl.protocols.sampling import sample_chunks, units_of
from collabrl.protocols.solo import SoloProtocol
from collabrl.protocols.strategy import StrategyProtocol
from collabrl.protocols.strategy_config import StrategyConfig
from tests.protocols.scripted import ScriptedEngine

SEEDED = SamplingParams(max_tokens=400, temperature=1.0, seed=5)
TASKS = [Task(f"p{i}", f"Solve problem p{i}.", reference=Reference("42")) for i in range(8)]
PROBLEM = re.compile(r"problem (p\d+)")


class SeedsByProblem(ScriptedEngine):
    """A scripted engine that keeps, per problem named in a prompt, the seed and budget
    each of its rows was sent with, call after call."""

    def __init__(self, tokenizer, replies) -> None:
        super().__init__(tokenizer, replies)
        self.sent: dict[str, list[tuple[int | None, int]]] = defaultdict(list)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        for i, prompt in enumerate(prompts):
            row = (params.prompt_seed(i), params.prompt_budget(i))
            self.sent[problem_of(self.tokenizer, prompt)].append(row)
        return super().generate(prompts, params)


def problem_of(tokenizer, prompt: Prompt) -> str:
    text = json.dumps(prompt) if isinstance(prompt[0], dict) else tokenizer.decode(prompt)
    return PROBLEM.findall(text)[0]


# Problem p5 alone, then beside seven others.
BATCHES = (TASKS[5:6], TASKS)


# -- budgets ---------------------------------------------------------------------------


def test_a_policy_round_asks_the_engine_for_each_rows_budget_in_the_params(smol_tokenizer):
    """Two episodes with 50 and 3 tokens left: one call whose params carry both budgets,
    and the row of an engine that writes past its budget is cut to it."""
    engine = SeedsByProblem(smol_tokenizer, lambda prompt: " word" * 30)
    policy = Policy(engine, smol_tokenizer, owns_engine=False)
    roomy, tight = (Episode(f"p{i}", policy.encode(f"Solve problem p{i}.")) for i in (0, 1))
    tight.add(Segment(Author.ENVIRONMENT, "", [1] * 47, None, {}))
    [first, second] = policy_turn(policy, [roomy, tight], SamplingParams(max_tokens=50), 0)
    assert engine.sent == {"p0": [(None, 50)], "p1": [(None, 3)]}
    assert len(second.token_ids) == 3 and second.meta["finish_reason"] == "length"
    assert len(first.token_ids) == 31  # 30 words and the EOS: within its 50


def test_continue_cuts_each_row_to_the_budget_its_params_give(smol_tokenizer):
    """`Policy.continue_` reads the budgets from the params: an engine that answers every
    row up to `max_tokens` (ignoring `budgets`) still yields segments within them."""
    engine = ScriptedEngine(smol_tokenizer, lambda prompt: " word" * 30)
    policy = Policy(engine, smol_tokenizer, owns_engine=False)
    params = SamplingParams(max_tokens=50).with_budgets([4, 50])
    assert params.budgets == (4, 50) and params.max_tokens == 50
    short, long = policy.continue_([[1, 2], [3, 4]], params)
    assert len(short.token_ids) == 4 and short.meta["finish_reason"] == "length"
    assert len(long.token_ids) == 31


# -- one seed rule: every stream of an episode, whatever its batch ----------------------


def run_consult(tokenizer, tasks: list[Task], monkeypatch) -> tuple[dict, dict]:
    """Consult over `tasks`: each episode asks K=3 experts about its problem, then answers.
    What the policy engine and the expert pool were sent, per problem."""
    body = [
        {"expert_id": k, "input_parameters": {"query": f"problem {{}} {k}?"}} for k in (1, 2, 3)
    ]
    turns: dict[str, int] = defaultdict(int)

    def reply(prompt: Prompt) -> str:
        problem = problem_of(tokenizer, prompt)
        turns[problem] += 1
        if turns[problem] > 1:  # the answers are in
            return "Answer: 42"
        return f"{AGENT_CALLS_OPEN}\n{json.dumps(body).replace('{}', problem)}\n{AGENT_CALLS_CLOSE}"

    engine = SeedsByProblem(tokenizer, reply)
    pool = ExpertPool(PoolConfig(endpoints=[REFERENCE], num_experts=3), tokenizer=tokenizer)
    experts: dict[str, list[int | None]] = defaultdict(list)
    real = pool._ask_each  # where every batch of calls goes, each with its own params

    async def spy(calls, params):
        for call, own in zip(calls, params, strict=True):
            experts[problem_of(tokenizer, call.prompt)].append(own.seed)
        return await real(calls, params)

    monkeypatch.setattr(pool, "_ask_each", spy)
    consult = ConsultProtocol(
        Policy(engine, tokenizer), pool, ConsultConfig(mode="open", expert_max_tokens=8)
    )
    try:
        consult.run(tasks, SEEDED)
    finally:
        consult.close()
    return engine.sent, experts


def test_policy_rounds_are_seeded_by_the_episode_whatever_the_batch(smol_tokenizer, monkeypatch):
    """Consult's policy rounds (turn-taking: rounds 0 and 1) of problem p5."""
    alone, batch = (run_consult(smol_tokenizer, tasks, monkeypatch)[0] for tasks in BATCHES)
    seeds = [seed for seed, _ in alone["p5"]]
    assert len(seeds) == len(set(seeds)) == 2 and None not in seeds
    assert [seed for seed, _ in batch["p5"]] == seeds


def test_expert_calls_are_seeded_by_their_episode_and_place_whatever_the_batch(
    smol_tokenizer, monkeypatch
):
    """The K experts asked in one turn are seeded apart by their place in that turn, not
    in the round's calls: p5's three queries keep their seeds beside seven other episodes."""
    alone, batch = (run_consult(smol_tokenizer, tasks, monkeypatch)[1] for tasks in BATCHES)
    assert len(alone["p5"]) == len(set(alone["p5"])) == 3 and None not in alone["p5"]
    assert batch["p5"] == alone["p5"]


def test_planner_decisions_are_seeded_by_the_episode_whatever_the_batch(smol_tokenizer):
    """The prompted planner's engine gets each decision's own seed (PLANNER_STREAM)."""

    def run(tasks: list[Task]) -> dict:
        planner_engine = SeedsByProblem(smol_tokenizer, lambda prompt: "continuation")
        policy = ScriptedEngine(smol_tokenizer, lambda prompt: "A step.\n\n")
        strategy = StrategyProtocol(
            Policy(policy, smol_tokenizer),
            PromptingPlanner(planner_engine, temperature=1.0),
            StrategyConfig(planner_kind="prompting", max_steps=2),
        )
        strategy.run([Task(t.problem_id, t.question) for t in tasks], SEEDED)
        return planner_engine.sent

    alone, batch = (run(tasks) for tasks in BATCHES)
    seeds = [seed for seed, _ in alone["p5"]]
    assert len(seeds) == len(set(seeds)) == 2 and None not in seeds
    assert [seed for seed, _ in batch["p5"]] == seeds


def test_a_units_seed_does_not_depend_on_the_chunk_it_is_sampled_in(smol_tokenizer):
    """`sample_chunks` (eval, the builders) hands every chunk the run's seed: problem p2's
    samples are seeded alike in chunks of one and of three units."""
    items = [Item(t.problem_id, t.question, "42") for t in TASKS[:3]]

    def seeds(chunk: int) -> dict:
        engine = SeedsByProblem(smol_tokenizer, lambda prompt: "It is 42.")
        solo = SoloProtocol(Policy(engine, smol_tokenizer), get_prompt("plain"), ())
        for _ in sample_chunks(solo, units_of(items, 2), chunk, SEEDED):
            pass
        return engine.sent

    alone = seeds(1)
    assert len({seed for seed, _ in alone["p2"]}) == 2
    assert seeds(3)["p2"] == alone["p2"]


def test_rsim_planner_draws_are_seeded_by_the_episode_whatever_the_batch(
    smol_tokenizer, tiny_model_dir
):
    """The rSIM head samples each decision from its own generator (`sample_rows`), seeded
    by the episode: p5's plan is the same alone and beside seven others."""
    planner = RSIMPlanner.from_ref(str(tiny_model_dir), temperature=1.0)

    def plans(tasks: list[Task]) -> dict[str, list[str]]:
        policy = ScriptedEngine(smol_tokenizer, lambda prompt: "A step.\n\n")
        strategy = StrategyProtocol(
            Policy(policy, smol_tokenizer), planner, StrategyConfig(max_steps=3)
        )
        episodes = strategy.run([Task(t.problem_id, t.question) for t in tasks], SEEDED)
        return {e.problem_id: e.meta["strategies"] for e in episodes}

    alone, batch = (plans(tasks) for tasks in BATCHES)
    assert alone["p5"] and batch["p5"] == alone["p5"]
    assert len({tuple(plan) for plan in batch.values()}) > 1  # other episodes draw apart
