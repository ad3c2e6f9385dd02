"""Issue 33 in `collab evolve`: one proposal whose tool call raises fails that candidate
(no answer, its error kept in the saved episode) and the round goes on."""

from __future__ import annotations

import json

from collabrl.data.benchmarks import Item
from collabrl.episode import EndReason
from collabrl.evolve import EvolveConfig
from collabrl.evolve.runner import Proposer, _propose
from collabrl.evolve.verify import Reviewer
from collabrl.protocols.apollo import ApolloConfig, ApolloProtocol
from collabrl.protocols.base import Policy
from collabrl.protocols.parsing import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from tests.protocols.scripted import ScriptedEngine
from tests.protocols.test_adversarial import BrokenRouter, OracleTool, by_task


def test_a_proposal_whose_tool_call_raises_fails_alone(smol_tokenizer) -> None:
    explode = json.dumps({"name": "explode", "arguments": {}})
    replies = {
        "Problem bad.": [f"{TOOL_CALL_OPEN}\n{explode}\n{TOOL_CALL_CLOSE}"],
        "Problem good.": ["It is \\boxed{7}."],
    }
    engine = ScriptedEngine(smol_tokenizer, by_task(smol_tokenizer, replies))
    config = ApolloConfig(tools=["python"])
    protocol = ApolloProtocol(Policy(engine, smol_tokenizer), BrokenRouter([OracleTool()]), config)
    proposers = [Proposer("scripted", protocol, Reviewer("scripted", engine))]
    items = [Item("bad", "Problem bad.", "7", None), Item("good", "Problem good.", "7", None)]
    evolve = EvolveConfig(models=["scripted"])
    evolve.sampling.n, evolve.sampling.max_tokens = 1, 200
    bad, good = _propose(evolve, proposers, items, [], 1)
    assert bad.answer is None and not bad.correct
    assert bad.episode["end"] == str(EndReason.ERROR)
    assert bad.episode["meta"]["error"].startswith("RuntimeError: router bug")
    assert good.answer == "7" and good.correct
