"""The embedded server's Prometheus metrics, recorded from what each request left."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from collabrl.serve.metrics import ServerMetrics

ROUTES = ("/v1/completions", "/v1/chat/completions", "/health")


def _samples(metrics: ServerMetrics, running: int = 0, waiting: int = 0) -> dict[str, float]:
    text = metrics.exposition(running, waiting).decode()
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _key(name: str, **labels: str) -> str:
    return name + str(sorted(labels.items()))


def test_an_answered_generation_counts_its_tokens_choices_and_latency() -> None:
    metrics = ServerMetrics("expert", ROUTES)
    state = {
        "usage": {"prompt_tokens": 7, "completion_tokens": 5},
        "finished": ["stop", "length", "length"],
    }
    metrics.observe("POST", "/v1/completions", 200, state, 0.4)
    metrics.observe("POST", "/v1/completions", 400, {}, 0.001)
    samples = _samples(metrics, running=2, waiting=3)
    model = {"model_name": "expert"}
    assert samples[_key("vllm:prompt_tokens_total", **model)] == 7
    assert samples[_key("vllm:generation_tokens_total", **model)] == 5
    assert samples[_key("vllm:request_success_total", finished_reason="length", **model)] == 2
    assert samples[_key("vllm:e2e_request_latency_seconds_count", **model)] == 1
    assert samples[_key("vllm:e2e_request_latency_seconds_bucket", le="0.5", **model)] == 1
    assert samples[_key("vllm:e2e_request_latency_seconds_bucket", le="0.3", **model)] == 0
    assert samples[_key("vllm:num_requests_running", **model)] == 2
    assert samples[_key("vllm:num_requests_waiting", **model)] == 3
    http = {"handler": "/v1/completions", "method": "POST"}
    assert samples[_key("http_requests_total", status="2xx", **http)] == 1
    assert samples[_key("http_requests_total", status="4xx", **http)] == 1
    assert not any("_created" in name for name in samples)  # as vLLM, no timestamp series


def test_a_path_no_route_serves_is_one_label_whatever_was_asked() -> None:
    metrics = ServerMetrics("expert", ROUTES)
    for path in ("/a", "/b", "/v1/embeddings"):
        metrics.observe("GET", path, 404, {}, 0.001)
    metrics.observe("GET", "/health", 200, {}, 0.001)
    samples = _samples(metrics)
    assert samples[_key("http_requests_total", handler="none", method="GET", status="4xx")] == 3
    assert _key("vllm:e2e_request_latency_seconds_count", model_name="expert") in samples
    assert samples[_key("vllm:e2e_request_latency_seconds_count", model_name="expert")] == 0


def test_two_servers_in_one_process_keep_their_counts_apart() -> None:
    first, second = ServerMetrics("a", ROUTES), ServerMetrics("b", ROUTES)
    first.observe("GET", "/health", 200, {}, 0.001)
    assert _key("http_requests_total", handler="/health", method="GET", status="2xx") not in (
        _samples(second)
    )
