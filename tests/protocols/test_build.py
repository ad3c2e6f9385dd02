"""`build_protocol`: in-process collaborators load where the engine config says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from collabrl.config import EngineConfig
from collabrl.protocols.build import build_protocol
from collabrl.protocols.config import ProtocolConfig

# Not the defaults (auto resolves to float32 on this CPU), so a pool that ignores the
# policy's engine config loads its model in float32 and is caught.
ENGINE = EngineConfig(device="cpu", dtype="bfloat16", chat_template_kwargs={"policy": True})


@pytest.mark.parametrize("name", ["relay", "consult"])
def test_a_local_teacher_or_expert_loads_on_the_engines_device_and_dtype(
    tiny_model_dir: Path, tiny_engine, name: str
) -> None:
    model = str(tiny_model_dir)
    collaborator = {"teacher": model} if name == "relay" else {"experts": [model]}
    config = ProtocolConfig(
        name=name, chat_template_kwargs={"enable_thinking": False}, **collaborator
    )
    protocol = build_protocol(config, model, ENGINE, policy_engine=tiny_engine)
    pool = protocol.teacher if name == "relay" else protocol.pool
    try:
        # The collaborators' chat-template options are the protocol's, not the policy's.
        assert pool.engine_config.chat_template_kwargs == {"enable_thinking": False}
        engine = pool._engine(pool.endpoint_for(1))
        weight = next(engine.model.parameters())
        assert (weight.device.type, weight.dtype) == ("cpu", torch.bfloat16)
    finally:
        protocol.close()
