"""How a protocol (or a data builder) loads and asks the models it brings in beside the
policy: one rule for a collaborator's engine options, one helper for a pool of them, one
for how its calls are sampled.

A relay teacher, consult's experts, the filter builder's teacher and the consult warm-up's
experts are all an `ExpertPool` built here; a prompted rSIM planner gets its engine from
`collaborator_engine` too. The protocol's chat-template options
(`protocol.chat_template_kwargs`) reach every collaborator that one way: on its engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from collabrl.config import EngineConfig, PoolConfig
from collabrl.engines.base import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from collabrl.engines.pool import ExpertPool


def collaborator_engine(engine: EngineConfig, chat_template_kwargs: dict[str, Any]) -> EngineConfig:
    """How a protocol loads a local teacher, expert or prompted planner: on the policy's
    device, in its dtype (by default the GPU when there is one), and with the policy's API
    key for a served one. Nothing else of the policy's engine carries over: the
    collaborators' chat-template options are the protocol's (`chat_template_kwargs`), the
    served model name is the policy's server's, and `kind` stays auto, which keeps a local
    collaborator off a second vLLM (see ExpertPool)."""
    return EngineConfig(
        device=engine.device,
        dtype=engine.dtype,
        api_key=engine.api_key,
        chat_template_kwargs=dict(chat_template_kwargs),
    )


def collaborator_pool(
    refs: Sequence[str],
    timeout: float,
    engine: EngineConfig | None = None,
    *,
    num_experts: int = 1,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> ExpertPool:
    """`num_experts` collaborators over the model references or base URLs `refs` (round
    robin), each call bounded by `timeout` seconds, loaded and served as `engine` says (a
    protocol's: `collaborator_engine`; a builder's: its own engine options). Retries,
    timeouts and failures become call records (see ExpertPool).

    `tokenizer` (the policy's) counts the `reference` stand-in's tokens, so that a call for
    n tokens gets n tokens of the policy's own."""
    from collabrl.engines.pool import ExpertPool  # the HTTP client: not to check a config

    pool = PoolConfig(endpoints=list(refs), num_experts=num_experts, timeout=timeout)
    return ExpertPool(pool, engine, tokenizer=tokenizer)


def collaborator_params(
    seeds: Sequence[int],
    budgets: Sequence[int],
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
) -> SamplingParams:
    """How one batch of collaborator calls is sampled: call i with its own seed
    `seeds[i]` (from `collaborator_seeds`: a group's samples must not share one) and its
    own token budget `budgets[i]`, at the collaborator's temperature and nucleus. Nothing
    of the policy's sampling carries over: no stop string or ban of its protocol (a
    collaborator writes plain text), no log-probs (nothing trains on its tokens)."""
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seeds=tuple(seeds))
    return params.with_budgets(budgets)
