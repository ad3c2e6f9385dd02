"""The policy a warm-up builder samples: the solo protocol over a model reference or URL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from collabrl.config import EngineConfig
from collabrl.data.prompts import PromptTemplate
from collabrl.engines import is_url
from collabrl.engines.base import Engine
from collabrl.models import resolve_model
from collabrl.protocols.build import build_protocol
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.solo import SoloProtocol


def check_model(model: str) -> None:
    """A mistyped model reference is an error before any folder is written."""
    if not is_url(model):
        resolve_model(model)


class PolicyConfig(Protocol):
    """What a builder's config says about its policy."""

    model: str
    tokenizer: str | None
    engine: EngineConfig


@contextmanager
def open_policy(
    config: PolicyConfig, template: PromptTemplate, engine: Engine | None = None
) -> Iterator[SoloProtocol]:
    """The policy answering alone with `template`, closed when the block ends.

    An `engine` built by the caller is used instead of loading the model, and left open.
    """
    solo = ProtocolConfig(name="solo", tokenizer=config.tokenizer)
    protocol = build_protocol(solo, config.model, config.engine, template, policy_engine=engine)
    try:
        yield protocol
    finally:
        protocol.close()
