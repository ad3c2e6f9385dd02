"""EAPO's Figure 4 consultation rate as a training metric: the share of a step's episodes
that sent at least one query to the experts, logged beside the queries per episode; and
the share of expert answers cut at expert_max_tokens."""

from __future__ import annotations

import json

import pytest

from collabrl.data.benchmarks import Item
from collabrl.engines.base import SamplingParams
from collabrl.engines.reference import REFERENCE
from collabrl.protocols.base import Policy
from collabrl.protocols.collaborators import collaborator_pool
from collabrl.protocols.consult import ConsultProtocol
from collabrl.protocols.consult_config import ConsultConfig
from collabrl.protocols.parsing import AGENT_CALLS_CLOSE, AGENT_CALLS_OPEN
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.rewards import log_episodes
from collabrl.train.rollout import ProtocolRollout
from tests.train.test_rollout import ScriptedPolicy

ITEM = Item("p", "What is 6 * 7?", "42", None)


def _calls(*experts: int) -> str:
    body = [{"expert_id": i, "input_parameters": {"query": "6 * 7?"}} for i in experts]
    return f"{AGENT_CALLS_OPEN}\n{json.dumps(body)}\n{AGENT_CALLS_CLOSE}"


def test_consult_rate_is_the_share_of_episodes_that_asked(smol_tokenizer) -> None:
    # Round 1 of three episodes: one asks all three experts, one asks one, one answers
    # alone; round 2: the two that asked answer.
    replies = [_calls(1, 2, 3), _calls(2), "Answer: 41", "Answer: 42", "Answer: 42"]
    engine = ScriptedPolicy(smol_tokenizer, replies)
    config = ConsultConfig(expert_max_tokens=6)
    pool = collaborator_pool([REFERENCE], 30.0, num_experts=3, tokenizer=smol_tokenizer)
    protocol = ConsultProtocol(Policy(engine, smol_tokenizer), pool, config)
    rollout = ProtocolRollout(protocol, engine, [ITEM], SamplingParams(max_tokens=400), 3)
    out = rollout.to_trl(protocol.run(rollout.tasks(["p"] * 3, 0), rollout.params))
    logged: dict[str, float] = {}
    log_episodes({**out, "log_metric": logged.__setitem__})
    # Queries per episode can exceed 1 (K experts a turn); the rate cannot.
    assert out["calls"] == [3, 1, 0]
    assert logged["episodes/calls"] == pytest.approx(4 / 3)
    assert out["consult_rate"] == [1.0, 1.0, 0.0]
    assert logged["episodes/consult_rate"] == pytest.approx(2 / 3)


def test_a_locked_episode_logs_no_consult_rate(smol_tokenizer) -> None:
    """Locked mode has no channel (the baseline, the evaluation): no rate of 0 to average
    into a curve as if the policy had chosen not to ask."""
    engine = ScriptedPolicy(smol_tokenizer, ["Answer: 42"])
    protocol = ConsultProtocol(Policy(engine, smol_tokenizer), None, ConsultConfig(mode="locked"))
    rollout = ProtocolRollout(protocol, engine, [ITEM], SamplingParams(max_tokens=64), 1)
    out = rollout.to_trl(protocol.run(rollout.tasks(["p"], 0), rollout.params))
    assert "consult_rate" not in out


def test_the_share_of_truncated_expert_answers_reaches_trls_metrics(
    smol_tokenizer, tiny_model_dir, tmp_path
) -> None:
    """Issue 50: a step's share of expert answers cut at expert_max_tokens is logged as
    episodes/expert_truncated (metrics.jsonl, the curves), through a real GRPOTrainer
    scoring a real consult rollout (no optimizer step). The reference stand-in's reply
    for 42 fits the cap; its reply for the longer answer is cut."""
    import datasets
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from collabrl.train.methods import registry as methods
    from collabrl.train.trainer import CURVE_KEYS

    reply = "The final answer is $\\boxed{42}$."
    cap = len(smol_tokenizer(reply, add_special_tokens=False)["input_ids"])
    items = [ITEM, Item("q", "What is 3 ** 40?", "12157665459056928801", None)]
    # Round 1: each of the four episodes asks expert 1 (p, p, q, q); round 2: they answer.
    replies = [_calls(1)] * 4 + ["Answer: 42"] * 4
    engine = ScriptedPolicy(smol_tokenizer, replies)
    pool = collaborator_pool([REFERENCE], 30.0, num_experts=3, tokenizer=smol_tokenizer)
    config = ConsultConfig(expert_max_tokens=cap)
    protocol = ConsultProtocol(Policy(engine, smol_tokenizer), pool, config)
    rollout = ProtocolRollout(protocol, engine, items, SamplingParams(max_tokens=400), 2)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=400,
        bf16=False,
        use_cpu=True,
        report_to=[],
        beta=0.0,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        reward_funcs=methods.get("eapo").rewards(GRPOTrainConfig(method="eapo")),
        args=args,
        train_dataset=datasets.Dataset.from_list([{"prompt": "p"}, {"prompt": "q"}]),
        processing_class=smol_tokenizer,
        rollout_func=rollout,
    )
    prompts = [{"prompt": "p"}, {"prompt": "p"}, {"prompt": "q"}, {"prompt": "q"}]
    trainer._generate_and_score_completions(prompts)
    mode = "train" if trainer.model.training else "eval"  # TRL files metrics by the mode
    assert trainer._metrics[mode]["episodes/expert_truncated"][-1] == pytest.approx(0.5)
    assert "episodes/expert_truncated" in CURVE_KEYS
    protocol.close()
