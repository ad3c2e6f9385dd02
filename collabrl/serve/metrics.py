"""The embedded server's Prometheus metrics (`GET /metrics`), under vLLM's names.

A dashboard or alert written for `vllm serve` reads the embedded server unchanged:
requests running and waiting, prompt and generated tokens, finished requests by
finish reason and their end-to-end latency carry vLLM's metric names and its
`model_name` label; every HTTP request is counted by method, route and status as
vLLM's server counts them (`http_requests_total`). Each app has a registry of its own,
so that two servers in one process (tests) keep apart.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
# The routes whose answers are generated text: their latency and tokens are recorded.
GENERATION_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
# vLLM's buckets for `e2e_request_latency_seconds`: a CPU's seconds to a GPU's hours.
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
UNKNOWN_ROUTE = "none"  # a path no route serves: one label value, whatever was asked


class ServerMetrics:
    """The counters a request updates once it is answered, and the queue's gauges, read
    from the batcher when scraped."""

    def __init__(self, model: str, routes: Collection[str]) -> None:
        # The `_created` timestamp series, which vLLM leaves out too (a process-wide switch).
        disable_created_metrics()
        self.routes = frozenset(routes)
        self.registry = CollectorRegistry()
        labels = {"labelnames": ["model_name"], "registry": self.registry}
        self.running = Gauge(
            "vllm:num_requests_running", "Requests in the batch being generated.", **labels
        ).labels(model)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting for a batch.", **labels
        ).labels(model)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of answered requests.", **labels
        ).labels(model)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens of answered requests.", **labels
        ).labels(model)
        self.latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Seconds from a generation request's arrival to its last byte.",
            buckets=LATENCY_BUCKETS,
            **labels,
        ).labels(model)
        self._success = Counter(
            "vllm:request_success",
            "Completions finished, by finish reason (one per choice).",
            labelnames=["model_name", "finished_reason"],
            registry=self.registry,
        )
        self._http = Counter(
            "http_requests",
            "HTTP requests answered, by method, route and status.",
            labelnames=["method", "handler", "status"],
            registry=self.registry,
        )
        self.model = model

    def observe(
        self, method: str, path: str, status: int, state: Mapping[str, Any], seconds: float
    ) -> None:
        """Record one answered request; `state` is what its route left (`usage`,
        `finished`: the finish reason of each choice)."""
        handler = path if path in self.routes else UNKNOWN_ROUTE
        self._http.labels(method, handler, f"{status // 100}xx").inc()
        if path not in GENERATION_ROUTES or status != 200 or "usage" not in state:
            return
        self.latency.observe(seconds)
        self.prompt_tokens.inc(state["usage"]["prompt_tokens"])
        self.generation_tokens.inc(state["usage"]["completion_tokens"])
        for reason in state.get("finished", ()):
            self._success.labels(self.model, reason).inc()

    def exposition(self, running: int, waiting: int) -> bytes:
        """The text exposition, the queue's gauges read now."""
        self.running.set(running)
        self.waiting.set(waiting)
        return generate_latest(self.registry)
