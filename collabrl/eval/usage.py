"""Usage counts of an episode (tokens, calls, strategies) and their run totals.

Per sample, `samples.jsonl` stores the counts of `episode_usage`; `usage_metrics`
sums them over a run. Ratios are ratios of sums (every token weighs the same), as
RelayLLM reports its call ratio.
"""

from __future__ import annotations

from typing import Any

from collabrl.episode import HELPERS, Author, Episode


def episode_usage(episode: Episode) -> dict[str, Any]:
    """Per-sample counts: tokens by author, calls and their failures, strategies."""
    completion = len(episode.response_ids) or sum(
        int(s.meta.get("reported_tokens", 0)) for s in episode.segments
    )
    return {
        "completion_tokens": completion,
        "policy_tokens": episode.tokens_by(Author.POLICY),
        "helper_tokens": episode.tokens_by(*HELPERS),
        "requested_helper_tokens": episode.requested_helper_tokens(),
        "calls": len(episode.calls),
        "call_failures": sum(s.meta.get("outcome") == "unavailable" for s in episode.calls),
        "format_errors": int(episode.meta.get("format_errors", 0)),
        "strategies_injected": len(episode.meta.get("strategies", [])),
        "strategies_used": sum(episode.meta.get("strategy_counts", {}).values()),
        "tool_calls": len(episode.tool_calls),
        "tool_errors": episode.tool_errors,
    }


def usage_metrics(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Run totals of the per-sample counts (records from before a field existed count 0)."""
    count = len(samples)

    def total(key: str) -> int:
        return sum(int(r.get(key, 0)) for r in samples)

    completion, helper = total("completion_tokens"), total("helper_tokens")
    requested = total("requested_helper_tokens")
    own = completion - helper
    seconds = sum(r["seconds"] for r in samples)
    return {
        "call_ratio": helper / completion if completion else 0.0,
        "call_ratio_requested": requested / (own + requested) if own + requested else 0.0,
        "calls_per_sample": total("calls") / count,
        "call_failures": total("call_failures"),
        "format_errors": total("format_errors"),
        "strategies_per_sample": total("strategies_used") / count,
        "strategies_injected_per_sample": total("strategies_injected") / count,
        "prompt_tokens": total("prompt_tokens"),
        "completion_tokens": completion,
        "mean_completion_tokens": completion / count,
        "truncated": sum(r["finish_reason"] == "length" for r in samples) / count,
        "generation_seconds": round(seconds, 2),
        "tokens_per_second": completion / seconds if seconds else 0.0,
        **tool_metrics(samples),
    }


def tool_metrics(samples: list[dict[str, Any]]) -> dict[str, float | None]:
    """AlphaApollo's tool metrics: how often tools were called and failed, and the
    accuracy of samples that used a tool against those that did not (its Figure 7).

    An accuracy over no samples is None, not 0: "never used a tool" is not "always wrong".
    """
    calls = sum(int(r.get("tool_calls", 0)) for r in samples)
    errors = sum(int(r.get("tool_errors", 0)) for r in samples)
    used = [r for r in samples if int(r.get("tool_calls", 0)) > 0]
    unused = [r for r in samples if int(r.get("tool_calls", 0)) == 0]

    def accuracy(group: list[dict[str, Any]]) -> float | None:
        return sum(bool(r.get("correct")) for r in group) / len(group) if group else None

    return {
        "tool_calls_per_sample": calls / len(samples),
        "tool_call_error_rate": errors / calls if calls else 0.0,
        "tool_use_rate": len(used) / len(samples),
        "accuracy_with_tools": accuracy(used),
        "accuracy_without_tools": accuracy(unused),
    }
