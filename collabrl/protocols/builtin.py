"""The parts of the five built-in protocols (solo, relay, consult, strategy, apollo):
builders, setup checks, reference stand-in tests and episode extras, which the specs at
the end of `registry.py` name (strategy's extras are `protocols/strategy.py`'s
`strategy_extras`). This module imports the registry for types only, so the two never
import each other.

Each builder imports its protocol when it runs, so that checking a config loads no
engine code.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from collabrl.config import EngineConfig
from collabrl.engines.reference import is_stand_in
from collabrl.episode import Episode
from collabrl.errors import MissingInput

if TYPE_CHECKING:
    from collabrl.data.prompts import PromptTemplate
    from collabrl.protocols.base import CollabProtocol
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.protocols.registry import BuildContext


def collaborator_engine(engine: EngineConfig) -> EngineConfig:
    """How the pools load a local teacher or expert: on the policy's device, in its dtype
    (by default the GPU when there is one). Nothing else of the policy's engine carries
    over: the collaborators' chat-template options are the protocol's own, and `kind`
    stays auto, which keeps a local collaborator off a second vLLM (see ExpertPool)."""
    return EngineConfig(device=engine.device, dtype=engine.dtype)


# -- solo ---------------------------------------------------------------------------


def build_solo(ctx: BuildContext) -> CollabProtocol:
    from collabrl.protocols.solo import SoloProtocol

    return SoloProtocol(ctx.policy, ctx.template, ctx.extract)


# -- relay --------------------------------------------------------------------------


def build_relay(ctx: BuildContext) -> CollabProtocol:
    from collabrl.protocols.relay import RelayProtocol

    config, engine = ctx.config, ctx.engine
    teacher = None
    if config.teacher:
        teacher = RelayProtocol.teacher_pool(
            config.teacher,
            config.relay,
            config.chat_template_kwargs,
            tokenizer=ctx.policy.tokenizer,
            engine=collaborator_engine(engine),
            api_key=engine.api_key,
        )
    return RelayProtocol(ctx.policy, teacher, ctx.template, config.relay, ctx.extract)


def check_relay(config: ProtocolConfig) -> None:
    if not config.teacher and not config.relay.teacher_free:
        raise MissingInput(
            "the relay protocol needs a teacher",
            "pass --teacher MODEL_OR_URL, or --set protocol.relay.teacher_free=true",
        )


def relay_uses_reference(config: ProtocolConfig) -> bool:
    return bool(config.teacher) and is_stand_in(config.teacher) and not config.relay.teacher_free


# -- consult ------------------------------------------------------------------------


def build_consult(ctx: BuildContext) -> CollabProtocol:
    from collabrl.config import PoolConfig
    from collabrl.engines.pool import ExpertPool
    from collabrl.protocols.consult import ConsultProtocol

    config = ctx.config
    pool = None
    if config.consult.mode == "open":
        experts = [ctx.model] if config.consult.self_collab else list(config.experts)
        pool = ExpertPool(
            PoolConfig(
                endpoints=experts,
                num_experts=config.consult.num_experts,
                timeout=config.consult.expert_timeout,
                api_key=ctx.engine.api_key,
                chat_template_kwargs=config.chat_template_kwargs,
            ),
            collaborator_engine(ctx.engine),
            tokenizer=ctx.policy.tokenizer,  # the `reference` stand-in counts policy tokens
        )
    return ConsultProtocol(ctx.policy, pool, config.consult, ctx.extract_fallback)


def consult_template(config: ProtocolConfig) -> PromptTemplate:
    from collabrl.protocols.consult import policy_template

    return policy_template(config.consult)


def check_consult(config: ProtocolConfig) -> None:
    has_experts = bool(config.experts) or config.consult.self_collab
    if config.consult.mode == "open" and not has_experts:
        raise MissingInput(
            "the consult protocol needs experts",
            "pass --expert MODEL_OR_URL, --self-collab, or --set protocol.consult.mode=locked",
        )


def consult_uses_reference(config: ProtocolConfig) -> bool:
    if config.consult.mode != "open":
        return False
    return not config.consult.self_collab and any(map(is_stand_in, config.experts))


def consult_extras(episode: Episode) -> dict[str, Any]:
    """The acceptance probability this step's schedule set (EAPO's ρ_s)."""
    if "accept_prob" not in episode.meta:
        return {}
    return {"accept_prob": episode.meta["accept_prob"]}


# -- strategy -----------------------------------------------------------------------


def build_strategy(ctx: BuildContext) -> CollabProtocol:
    from collabrl.protocols.planner import load_planner
    from collabrl.protocols.strategy import StrategyProtocol

    strategy = ctx.config.strategy
    planner = None
    if strategy.planner_kind != "ps+":
        # A prompted planner is a collaborator: it gets their chat-template options.
        planner_engine = dataclasses.replace(
            ctx.engine, chat_template_kwargs=ctx.config.chat_template_kwargs
        )
        planner = load_planner(
            ctx.config.planner,
            strategy.planner_kind,
            strategy.planner_temperature,
            strategy.head_seed,
            planner_engine,
            strategy.masked_indices(),
        )
    return StrategyProtocol(ctx.policy, planner, strategy, ctx.extract_fallback)


def strategy_template(config: ProtocolConfig) -> PromptTemplate:
    from collabrl.protocols.strategy import policy_template

    return policy_template(config.strategy)


def check_strategy(config: ProtocolConfig) -> None:
    if config.strategy.planner_kind != "ps+" and not config.planner:
        raise MissingInput("the strategy protocol needs a planner", "pass --planner MODEL_OR_URL")


# -- apollo -------------------------------------------------------------------------


def build_apollo(ctx: BuildContext) -> CollabProtocol:
    from collabrl.protocols.apollo import ApolloProtocol, build_router

    ctx.policy.require_tokenizer("apollo")  # before the tools start
    router = build_router(ctx.config.apollo)
    try:
        return ApolloProtocol(ctx.policy, router, ctx.config.apollo, ctx.extract_fallback)
    except BaseException:
        router.close()
        raise
