"""Which endpoint of the expert pool serves which expert, and what a pool config must
hold before any engine is built."""

from __future__ import annotations

from collabrl.config import EndpointConfig, PoolConfig
from collabrl.engines import is_url
from collabrl.engines.reference import is_stand_in
from collabrl.errors import UserError

ASSIGNMENTS = ("round_robin", "per_expert")


def check_pool_config(config: PoolConfig) -> None:
    """Reject a pool that cannot work, before any engine is built."""
    if not config.endpoints:
        raise UserError("the expert pool has no endpoints", "pass --expert URL_OR_MODEL")
    if config.num_experts < 1:
        raise UserError(f"num_experts must be >= 1, got {config.num_experts}", "set K to 1..")
    if config.assignment not in ASSIGNMENTS:
        raise UserError(
            f"unknown expert assignment '{config.assignment}'", f"use {' or '.join(ASSIGNMENTS)}"
        )
    if config.assignment == "per_expert" and len(config.endpoints) != config.num_experts:
        raise UserError(
            f"per_expert assignment needs one endpoint per expert: {config.num_experts} "
            f"experts but {len(config.endpoints)} endpoints",
            f"pass exactly {config.num_experts} --expert options, or use round_robin",
        )
    if config.timeout <= 0:
        raise UserError(f"pool timeout must be > 0 seconds, got {config.timeout}")
    if config.retries < 0 or config.backoff < 0:
        raise UserError("pool retries and backoff must be >= 0")


def resolve_endpoints(config: PoolConfig) -> list[EndpointConfig]:
    """The pool's endpoints, each with the pool-wide served model and API key."""
    return [
        EndpointConfig(ref=ref, served_model=config.served_model, api_key=config.api_key)
        for ref in config.endpoints
    ]


def endpoint_index(expert_id: int, num_experts: int, num_endpoints: int) -> int | None:
    """Which endpoint serves an expert, or None for an id outside 1..K.

    Round robin and per-expert share the formula: with one endpoint per expert,
    `(i - 1) % K` is simply `i - 1`.
    """
    if isinstance(expert_id, bool) or not isinstance(expert_id, int):
        return None
    if not 1 <= expert_id <= num_experts:
        return None
    return (expert_id - 1) % num_endpoints


def endpoint_name(endpoint: EndpointConfig) -> str:
    """How records and logs name an endpoint (never with its API key)."""
    if is_stand_in(endpoint.ref):
        return f"{endpoint.ref} (stand-in)"
    if is_url(endpoint.ref) and endpoint.served_model:
        return f"{endpoint.served_model}@{endpoint.ref}"
    return endpoint.ref


def engine_key(endpoint: EndpointConfig) -> tuple[str | None, ...]:
    """What makes two endpoints one engine."""
    # A local model is one set of weights whatever name it is asked by; URL endpoints
    # differ by the model and key they send, so those are part of their identity.
    if is_url(endpoint.ref):
        return ("url", endpoint.ref, endpoint.served_model, endpoint.api_key)
    return ("local", endpoint.ref)


# A server that does not list its models within this long is not one a run can use.
PROBE_TIMEOUT = 5.0


def check_reachable(ref: str, api_key: str | None) -> None:
    """One request to the `/models` of the OpenAI-compatible server at `ref`: a server
    that is down, rejects the key or is not such a server is one error before any work,
    where a run would otherwise start and fail every call."""
    import openai

    from collabrl.engines.openai_http import (
        bad_response,
        map_error,
        normalize_base_url,
        resolve_api_key,
    )

    base = normalize_base_url(ref)
    client = openai.OpenAI(
        base_url=base, api_key=resolve_api_key(api_key), timeout=PROBE_TIMEOUT, max_retries=0
    )
    try:
        client.models.list()
    except openai.OpenAIError as err:
        raise map_error(err, base, "") from err
    except (ValueError, AttributeError) as err:  # bytes that are not an API's JSON
        raise bad_response(base, err) from err
    finally:
        client.close()


def check_collaborator(ref: str, api_key: str | None) -> None:
    """A collaborator reference that cannot serve: an unreachable URL, or a local model
    that does not resolve (the `reference` stand-in always can)."""
    if is_stand_in(ref):
        return
    if is_url(ref):
        check_reachable(ref, api_key)
        return
    from collabrl.models import resolve_model

    resolve_model(ref)
