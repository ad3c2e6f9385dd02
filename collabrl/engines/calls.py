"""What the expert pool is asked and what it answers: a `Call` to one expert, the
`CallRecord` of what happened to it, and `stats` over many records."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, NamedTuple

from collabrl.config import EndpointConfig
from collabrl.engines.base import Completion, Prompt
from collabrl.engines.endpoints import endpoint_name
from collabrl.engines.reference import Reference

Outcome = Literal["ok", "unavailable", "cached"]
UNKNOWN_EXPERT = "unknown expert id"


class Call(NamedTuple):
    """One question to one expert; `reference` is what the `reference` stand-in answers
    from (the item's gold answer), ignored by every real endpoint."""

    expert_id: int
    prompt: Prompt
    reference: Reference | None = None


@dataclass
class CallRecord:
    """What happened to one call to one expert."""

    expert_id: int
    endpoint: str  # display name of the endpoint (no API key)
    prompt: Prompt
    text: str | None
    outcome: Outcome
    error: str | None = None
    latency_s: float = 0.0  # wall time of the call, retries and backoff included
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0  # requests actually sent; 0 for cache hits and unroutable calls
    # "stop" (the model's EOS, or a stop string) or "length"; None when nothing came back.
    # RelayLLM ends the episode when the teacher's reply ends at its EOS.
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        """An answer is available, fresh or from the cache."""
        return self.outcome != "unavailable"


def call_record(
    expert_id: int,
    endpoint: EndpointConfig,
    prompt: Prompt,
    completion: Completion | None,
    error: str | None,
    attempts: int,
    started: float,
) -> CallRecord:
    """The record of a call that ended with `completion`, or unavailable with `error`."""
    latency = time.perf_counter() - started
    name = endpoint_name(endpoint)
    if completion is None:
        return CallRecord(
            expert_id, name, prompt, None, "unavailable", error, latency, attempts=attempts
        )
    return CallRecord(
        expert_id,
        name,
        prompt,
        completion.text,
        "ok",
        None,
        latency,
        completion.prompt_tokens,
        completion.completion_tokens,
        attempts,
        completion.finish_reason,
    )


def stats(records: list[CallRecord]) -> dict[str, int | float]:
    """Counts, mean latency of the calls that reached an engine, and token totals.

    Cached records carry the token counts of the call that produced them.
    """
    sent = [r.latency_s for r in records if r.attempts > 0]
    return {
        "calls": len(records),
        "ok": sum(r.outcome == "ok" for r in records),
        "unavailable": sum(r.outcome == "unavailable" for r in records),
        "cached": sum(r.outcome == "cached" for r in records),
        "mean_latency_s": sum(sent) / len(sent) if sent else 0.0,
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "completion_tokens": sum(r.completion_tokens for r in records),
    }
