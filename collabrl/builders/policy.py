"""The policy a warm-up builder samples: the solo protocol over a model reference or URL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from collabrl.config import EngineConfig
from collabrl.data.prompts import PromptTemplate
from collabrl.engines import is_url
from collabrl.models import resolve_model
from collabrl.protocols.build import build_protocol
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.solo import SoloProtocol


def check_model(model: str) -> None:
    """A mistyped model reference is an error before any folder is written."""
    if not is_url(model):
        resolve_model(model)


@contextmanager
def open_policy(
    model: str, engine: EngineConfig, tokenizer: str | None, template: PromptTemplate
) -> Iterator[SoloProtocol]:
    """The policy answering alone with `template`, closed when the block ends."""
    protocol = build_protocol(
        ProtocolConfig(name="solo", tokenizer=tokenizer), model, engine, template
    )
    try:
        yield protocol
    finally:
        protocol.close()
