"""Every episode's round, and every expert and teacher call, gets its own seed.

vLLM and OpenAI-compatible servers seed each request on its own: a seed shared by the
G samples of a problem made them one text, and every GRPO advantage 0 (issue 22).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from collabrl.config import PoolConfig
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import Completion, Prompt, SamplingParams
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import REFERENCE, Reference
from collabrl.episode import Episode
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.consult import ConsultConfig, ConsultProtocol
from collabrl.protocols.parsing import AGENT_CALLS_CLOSE, AGENT_CALLS_OPEN
from collabrl.protocols.relay import RelayConfig, RelayProtocol
from collabrl.protocols.seeds import COLLABORATOR_STREAM, POLICY_STREAM, episode_seed
from collabrl.protocols.solo import SoloProtocol
from tests.protocols.scripted import ScriptedEngine

PARAMS = SamplingParams(max_tokens=64, temperature=1.0, seed=11)
GROUP = [Task("p1", "What is 6 * 7?", sample=s, reference=Reference("42")) for s in range(4)]


class SeedRecorder(ScriptedEngine):
    """A scripted policy that keeps the seed each prompt of each call was given."""

    def __init__(self, tokenizer, replies) -> None:
        super().__init__(tokenizer, replies)
        self.seeds: list[list[int | None]] = []

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[list[Completion]]:
        self.seeds.append([params.prompt_seed(i) for i in range(len(prompts))])
        return super().generate(prompts, params)


def episode(problem: str = "p", sample: int = 0) -> Episode:
    return Episode(problem, [1], meta={"sample": sample})


def test_an_episode_seed_depends_on_the_problem_sample_round_and_stream() -> None:
    base = episode_seed(PARAMS, episode(), 0)
    assert base == episode_seed(PARAMS, episode(), 0)  # the same in every process
    others = [
        episode_seed(PARAMS, episode(sample=1), 0),
        episode_seed(PARAMS, episode("q"), 0),
        episode_seed(PARAMS, episode(), 1),
        episode_seed(PARAMS, episode(), 0, COLLABORATOR_STREAM),
        episode_seed(SamplingParams(seed=12), episode(), 0, POLICY_STREAM),
    ]
    assert base not in others and len(set(others)) == len(others)
    assert all(0 <= s < 2**31 for s in [base, *others])  # vLLM and servers take int32
    assert episode_seed(SamplingParams(seed=None), episode(), 0) is None


def test_the_samples_of_a_group_are_sent_with_distinct_seeds(smol_tokenizer) -> None:
    engine = SeedRecorder(smol_tokenizer, lambda prompt: "42")
    solo = SoloProtocol(Policy(engine, smol_tokenizer), get_prompt("plain"), ())
    solo.run(GROUP, PARAMS)
    [seeds] = engine.seeds
    assert None not in seeds and len(set(seeds)) == len(GROUP)
    # An episode's seed is its own, whatever else is in the batch.
    solo.run(GROUP[::-1], PARAMS)
    assert engine.seeds[1] == seeds[::-1]
    solo.run(GROUP[2:3], PARAMS)
    assert engine.seeds[2] == [seeds[2]]


def test_each_relay_teacher_call_has_its_episodes_seed(smol_tokenizer, monkeypatch) -> None:
    engine = SeedRecorder(smol_tokenizer, lambda prompt: "Let me ask. <call>4</call>")
    teacher = ExpertPool(PoolConfig(endpoints=[REFERENCE], num_experts=1), tokenizer=smol_tokenizer)
    asked: list[SamplingParams] = []
    real = teacher.ask_sync

    def spy(calls, params):
        asked.append(params)
        return real(calls, params)

    monkeypatch.setattr(teacher, "ask_sync", spy)
    relay = RelayProtocol(
        Policy(engine, smol_tokenizer), teacher, get_prompt("relay"), RelayConfig(), ()
    )
    try:
        relay.run(GROUP, PARAMS)
    finally:
        teacher.close()
    first = asked[0].seeds
    assert len(first) == len(set(first)) == len(GROUP)
    assert [asked[0].prompt_budget(i) for i in range(len(GROUP))] == [4] * len(GROUP)


def test_the_k_experts_of_a_turn_are_asked_with_distinct_seeds(
    smol_tokenizer, tiny_model_dir: Path, monkeypatch
) -> None:
    body = [{"expert_id": i, "input_parameters": {"query": "6 * 7?"}} for i in (1, 2, 3)]
    call = f"{AGENT_CALLS_OPEN}\n{json.dumps(body)}\n{AGENT_CALLS_CLOSE}"
    replies = iter([call, call, "Answer: 42", "Answer: 42"])
    engine = SeedRecorder(smol_tokenizer, lambda prompt: next(replies))
    config = PoolConfig(endpoints=[str(tiny_model_dir)], num_experts=3)
    asked: list[SamplingParams] = []
    with ExpertPool(config) as pool:
        real = pool.ask_sync

        def spy(calls, params):
            asked.append(params)
            return real(calls, params)

        monkeypatch.setattr(pool, "ask_sync", spy)
        consult = ConsultProtocol(
            Policy(engine, smol_tokenizer),
            pool,
            ConsultConfig(mode="open", expert_max_tokens=4, expert_temperature=1.0),
        )
        episodes = consult.run(GROUP[:2], dataclasses.replace(PARAMS, max_tokens=256))
    seeds = asked[0].seeds
    assert len(seeds) == 6 and len(set(seeds)) == 6
    assert asked[0].temperature == 1.0
    # Two samples with the same three queries: the sampled expert answers differ.
    answers = [[s.text for s in e.calls] for e in episodes]
    assert answers[0] != answers[1]


def test_pool_calls_asked_together_are_sampled_apart(tiny_model_dir: Path) -> None:
    """`ask` samples call i with seed + i, as one engine batch does: equal prompts to
    one expert come back as different samples."""
    config = PoolConfig(endpoints=[str(tiny_model_dir)], num_experts=1)
    hot = SamplingParams(max_tokens=8, temperature=1.0, seed=3)
    with ExpertPool(config) as pool:
        records = pool.ask_sync([(1, "Hello")] * 3, hot)
        again = pool.ask_sync([(1, "Hello")] * 3, hot)
    texts = [r.text for r in records]
    assert len(set(texts)) > 1
    assert texts == [r.text for r in again]  # and the same seeds repeat


@pytest.mark.parametrize("seed", [0, 5])
def test_the_transformers_engine_honours_per_prompt_seeds(tiny_engine, seed: int) -> None:
    hot = SamplingParams(max_tokens=6, temperature=1.0, seed=99)
    same = tiny_engine.generate(["Hi", "Hi"], SamplingParams(**{**vars(hot), "seeds": (seed,) * 2}))
    assert same[0][0].token_ids == same[1][0].token_ids
    apart = tiny_engine.generate(["Hi", "Hi"], SamplingParams(**{**vars(hot), "seeds": (1, 2)}))
    assert apart[0][0].token_ids != apart[1][0].token_ids
    alone = tiny_engine.generate(["Hi"], SamplingParams(**{**vars(hot), "seeds": (2,)}))
    assert alone[0][0].token_ids == apart[1][0].token_ids
    with pytest.raises(ValueError, match="one per prompt"):
        tiny_engine.generate(["Hi"], SamplingParams(**{**vars(hot), "seeds": (1, 2)}))
