"""Build a protocol, with its policy and collaborators, from a `ProtocolConfig`."""

from __future__ import annotations

import dataclasses

from collabrl.config import EngineConfig, PoolConfig
from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines.base import Engine
from collabrl.engines.pool import ExpertPool
from collabrl.errors import UserError
from collabrl.models import load_tokenizer
from collabrl.protocols.base import CollabProtocol, Policy
from collabrl.protocols.config import ProtocolConfig

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
    """The protocol `config.name` over the policy `model`.

    `template` is the policy's prompt for solo and relay (consult, strategy and apollo
    use their papers' own prompts); `extract_fallback` adds a benchmark's answer rules.
    A `policy_engine` already built by the caller is used as is and left open.
    """
    check_protocol(config, template)
    if policy_engine is not None:
        tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
        tokenizer = tokenizer or getattr(policy_engine, "tokenizer", None)
        policy = Policy(policy_engine, tokenizer, owns_engine=False)
    else:
        policy = Policy.load(model, engine, config.tokenizer)
    try:
        return _build(config, policy, model, engine, template, extract_fallback)
    except BaseException:
        policy.close()
        raise


def check_protocol(config: ProtocolConfig, template: PromptTemplate | None) -> None:
    """Refuse a protocol setup that cannot run, before any model is loaded."""
    config.check()
    if template is not None and config.name in ("consult", "strategy", "apollo"):
        raise UserError(
            f"the {config.name} protocol uses its paper's prompts",
            "drop --prompt for this protocol",
        )


def collaborator_engine(engine: EngineConfig) -> EngineConfig:
    """How the pools load a local teacher or expert: on the policy's device, in its dtype
    (by default the GPU when there is one). Nothing else of the policy's engine carries
    over: the collaborators' chat-template options are the protocol's own, and `kind`
    stays auto, which keeps a local collaborator off a second vLLM (see ExpertPool)."""
    return EngineConfig(device=engine.device, dtype=engine.dtype)


def _expert_refs(config: ProtocolConfig, model: str) -> list[str]:
    return [model] if config.consult.self_collab else list(config.experts)


def _build(
    config: ProtocolConfig,
    policy: Policy,
    model: str,
    engine: EngineConfig,
    template: PromptTemplate | None,
    extract_fallback: tuple[str, ...],
) -> CollabProtocol:
    template = template or get_prompt(DEFAULT_PROMPT)
    extract = (*template.extract, *extract_fallback)
    if config.name == "solo":
        from collabrl.protocols.solo import SoloProtocol

        return SoloProtocol(policy, template, extract)
    if config.name == "relay":
        from collabrl.protocols.relay import RelayProtocol

        teacher = None
        if config.teacher:
            teacher = RelayProtocol.teacher_pool(
                config.teacher,
                config.relay,
                config.chat_template_kwargs,
                tokenizer=policy.tokenizer,
                engine=collaborator_engine(engine),
                api_key=engine.api_key,
            )
        return RelayProtocol(policy, teacher, template, config.relay, extract)
    if config.name == "consult":
        from collabrl.protocols.consult import ConsultProtocol

        pool = None
        if config.consult.mode == "open":
            pool = ExpertPool(
                PoolConfig(
                    endpoints=_expert_refs(config, model),
                    num_experts=config.consult.num_experts,
                    timeout=config.consult.expert_timeout,
                    api_key=engine.api_key,
                    chat_template_kwargs=config.chat_template_kwargs,
                ),
                collaborator_engine(engine),
                tokenizer=policy.tokenizer,  # the `reference` stand-in counts policy tokens
            )
        return ConsultProtocol(policy, pool, config.consult, extract_fallback)
    if config.name == "apollo":
        from collabrl.protocols.apollo import ApolloProtocol, build_router

        policy.require_tokenizer("apollo")  # before the tools start
        router = build_router(config.apollo)
        try:
            return ApolloProtocol(policy, router, config.apollo, extract_fallback)
        except BaseException:
            router.close()
            raise
    from collabrl.protocols.planner import load_planner
    from collabrl.protocols.strategy import StrategyProtocol

    planner = None
    strategy = config.strategy
    if strategy.planner_kind != "ps+":
        # A prompted planner is a collaborator: it gets their chat-template options.
        planner_engine = dataclasses.replace(
            engine, chat_template_kwargs=config.chat_template_kwargs
        )
        planner = load_planner(
            config.planner,
            strategy.planner_kind,
            strategy.planner_temperature,
            strategy.head_seed,
            planner_engine,
            strategy.masked_indices(),
        )
    return StrategyProtocol(policy, planner, config.strategy, extract_fallback)
