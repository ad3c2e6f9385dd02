"""Build a protocol, with its policy and collaborators, from a `ProtocolConfig`."""

from __future__ import annotations

from collabrl.config import EngineConfig
from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines.base import Engine
from collabrl.errors import UserError
from collabrl.models import load_tokenizer
from collabrl.protocols import registry
from collabrl.protocols.base import CollabProtocol, Policy
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.spec import BuildContext

# The prompt a protocol uses when neither the user nor the benchmark names one.
DEFAULT_PROMPT = "relay"


def build_protocol(
    config: ProtocolConfig,
    model: str,
    engine: EngineConfig,
    template: PromptTemplate | None = None,
    extract_fallback: tuple[str, ...] = (),
    policy_engine: Engine | None = None,
) -> CollabProtocol:
    """The protocol `config.name` over the policy `model`, built by its registry spec.

    `template` is the policy's prompt (refused for a protocol that brings its paper's
    own prompts; none: the relay template); `extract_fallback` adds a benchmark's answer
    rules. A `policy_engine` already built by the caller is used as is and left open.
    """
    check_protocol(config, template)
    if policy_engine is not None:
        tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
        tokenizer = tokenizer or getattr(policy_engine, "tokenizer", None)
        policy = Policy(policy_engine, tokenizer, owns_engine=False)
    else:
        policy = Policy.load(model, engine, config.tokenizer)
    try:
        template = template or get_prompt(DEFAULT_PROMPT)
        options = registry.read_options(config)
        context = BuildContext(config, policy, model, engine, template, extract_fallback, options)
        return registry.get(config.name).build(context)
    except BaseException:
        policy.close()
        raise


def check_protocol(config: ProtocolConfig, template: PromptTemplate | None) -> None:
    """Refuse a protocol setup that cannot run, before any model is loaded."""
    registry.check_protocol_config(config)
    if template is not None and registry.get(config.name).own_prompt:
        raise UserError(
            f"the {config.name} protocol uses its paper's prompts",
            "drop --prompt for this protocol",
        )
