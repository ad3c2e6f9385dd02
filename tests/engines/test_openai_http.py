"""Tests for the OpenAI-compatible HTTP engine: pure helpers plus a real local server."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion as OACompletion
from openai.types.chat import ChatCompletion

from collabrl.engines.base import Engine, SamplingParams
from collabrl.engines.openai_http import (
    OpenAIEngine,
    build_request,
    map_error,
    normalize_base_url,
    parse_choice,
    parse_response,
    prompt_kind,
    resolve_api_key,
)
from collabrl.errors import UserError

URL = "http://127.0.0.1:8000/v1"

# ---------------------------------------------------------------------------------------------
# build_request
# ---------------------------------------------------------------------------------------------


def test_text_prompt_goes_to_completions_with_defaults_only() -> None:
    kind, kw = build_request("2+2=", SamplingParams(max_tokens=8), "m")
    assert kind == "completions"
    assert kw == {
        "model": "m",
        "prompt": "2+2=",
        "max_tokens": 8,
        "temperature": 0.0,
        "top_p": 1.0,
        "n": 1,
    }


def test_token_id_prompt_goes_to_completions_as_int_list() -> None:
    kind, kw = build_request([1, 2, 3], SamplingParams(), "m")
    assert kind == "completions"
    assert kw["prompt"] == [1, 2, 3]


def test_chat_prompt_goes_to_chat_with_messages() -> None:
    messages = [{"role": "user", "content": "hi"}]
    kind, kw = build_request(messages, SamplingParams(n=3, temperature=0.7), "m")
    assert kind == "chat"
    assert kw["messages"] == messages
    assert "prompt" not in kw
    assert kw["n"] == 3 and kw["temperature"] == 0.7


def test_a_final_assistant_message_is_continued() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "He"}]
    _, kw = build_request(messages, SamplingParams(), "m")
    assert kw["extra_body"] == {"continue_final_message": True, "add_generation_prompt": False}
    _, plain = build_request(messages[:1], SamplingParams(), "m")
    assert "extra_body" not in plain


def test_optional_fields_are_omitted_when_unset() -> None:
    _, kw = build_request("x", SamplingParams(seed=None, top_k=-1, stop=()), "m")
    assert "seed" not in kw and "stop" not in kw and "logprobs" not in kw
    assert "extra_body" not in kw  # hosted APIs reject vLLM-only fields
    _, kw = build_request("x", SamplingParams(top_k=0), "m")
    assert "extra_body" not in kw


def test_optional_fields_are_sent_when_set() -> None:
    params = SamplingParams(
        seed=7, top_k=20, stop=("\n\n", "END"), include_stop=True, banned=("foo", "bar")
    )
    _, kw = build_request("x", params, "m")
    assert kw["seed"] == 7
    assert kw["stop"] == ["\n\n", "END"]
    assert kw["extra_body"] == {
        "top_k": 20,
        "include_stop_str_in_output": True,
        "bad_words": ["foo", "bar"],
    }


def test_logprobs_request_shape_per_endpoint() -> None:
    params = SamplingParams(logprobs=True)
    _, chat = build_request([{"role": "user", "content": "q"}], params, "m")
    assert chat["logprobs"] is True and chat["top_logprobs"] == 0
    _, comp = build_request("q", params, "m")
    assert comp["logprobs"] == 1 and "top_logprobs" not in comp


def test_chat_template_kwargs_go_with_chat_requests_only() -> None:
    options = {"enable_thinking": False}
    messages = [{"role": "user", "content": "q"}]
    _, chat = build_request(messages, SamplingParams(), "m", options)
    assert chat["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}
    _, text = build_request("q", SamplingParams(), "m", options)
    assert "extra_body" not in text  # a text prompt is already rendered
    _, plain = build_request(messages, SamplingParams(), "m", {})
    assert "extra_body" not in plain


def test_token_id_prompts_ask_for_the_sampled_ids() -> None:
    _, ids = build_request([1, 2, 3], SamplingParams(), "m")
    assert ids["extra_body"] == {"return_token_ids": True}
    _, with_logprobs = build_request([1, 2, 3], SamplingParams(logprobs=True), "m")
    # Older vLLM gives the ids only as log-prob tokens "token_id:N".
    assert with_logprobs["extra_body"] == {
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    _, text = build_request("x", SamplingParams(logprobs=True), "m")
    assert "extra_body" not in text


@pytest.mark.parametrize("bad", [[], [1, "a"], [True, 2], 42, None])
def test_invalid_prompts_are_rejected(bad: Any) -> None:
    with pytest.raises(ValueError):
        prompt_kind(bad)


# ---------------------------------------------------------------------------------------------
# parse_choice / parse_response
# ---------------------------------------------------------------------------------------------


def _completion_response(choices: list[dict], prompt_tokens: int = 4) -> OACompletion:
    return OACompletion.model_validate(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 0,
            "model": "m",
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 3,
                "total_tokens": prompt_tokens + 3,
            },
        }
    )


def _chat_response(choices: list[dict]) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chat-1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": choices,
            "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
        }
    )


def test_parse_completions_choice_with_logprobs_and_vllm_stop_reason() -> None:
    response = _completion_response(
        [
            {
                "index": 0,
                "text": "The answer",
                "finish_reason": "stop",
                "stop_reason": "\n\n",  # vLLM extension, kept as an extra field
                "logprobs": {
                    "tokens": ["The", " answer"],
                    "token_logprobs": [-0.5, -1.25],
                    "text_offset": [0, 3],
                    "top_logprobs": None,
                },
            }
        ]
    )
    params = SamplingParams(stop=("\n\n",), logprobs=True)
    c = parse_choice(response.choices[0], "completions", params, prompt_tokens=4)
    assert c.text == "The answer"
    assert c.logprobs == [-0.5, -1.25]
    assert c.finish_reason == "stop" and c.stop_reason == "\n\n"
    assert c.token_ids == [] and c.prompt_tokens == 4


def test_parse_chat_choice_with_logprobs() -> None:
    response = _chat_response(
        [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Yes."},
                "finish_reason": "length",
                "logprobs": {
                    "content": [
                        {"token": "Yes", "logprob": -0.1, "bytes": None, "top_logprobs": []},
                        {"token": ".", "logprob": -0.2, "bytes": None, "top_logprobs": []},
                    ],
                    "refusal": None,
                },
            }
        ]
    )
    [c] = parse_response(response, "chat", SamplingParams(logprobs=True))
    assert c.text == "Yes."
    assert c.logprobs == [-0.1, -0.2]
    assert c.finish_reason == "length" and c.stop_reason is None
    assert c.prompt_tokens == 9


def test_parse_token_ids_of_new_and_old_vllm() -> None:
    new = _completion_response(
        [{"index": 0, "text": "ab", "finish_reason": "stop", "token_ids": [7, 8, 2]}]
    )
    assert parse_choice(new.choices[0], "completions", SamplingParams()).token_ids == [7, 8, 2]
    old = _completion_response(
        [
            {
                "index": 0,
                "text": "ab",
                "finish_reason": "stop",
                "logprobs": {
                    "tokens": ["token_id:7", "token_id:8", "token_id:2"],
                    "token_logprobs": [-0.1, -0.2, -0.3],
                    "text_offset": None,
                    "top_logprobs": None,
                },
            }
        ]
    )
    c = parse_choice(old.choices[0], "completions", SamplingParams(logprobs=True))
    assert c.token_ids == [7, 8, 2] and c.logprobs == [-0.1, -0.2, -0.3]
    plain = _completion_response([{"index": 0, "text": "ab", "finish_reason": "stop"}])
    assert parse_choice(plain.choices[0], "completions", SamplingParams()).token_ids == []


def test_ids_are_dropped_when_the_text_is_cut_client_side() -> None:
    """Which ids the cut text keeps is unknown: better none (re-encoded) than wrong ones."""
    response = _completion_response(
        [{"index": 0, "text": "a STOP b", "finish_reason": "length", "token_ids": [1, 2, 3]}]
    )
    c = parse_choice(response.choices[0], "completions", SamplingParams(stop=("STOP",)))
    assert c.text == "a " and c.token_ids == []


def test_logprobs_are_dropped_when_not_requested() -> None:
    response = _completion_response(
        [
            {
                "index": 0,
                "text": "a",
                "finish_reason": "length",
                "logprobs": {"tokens": ["a"], "token_logprobs": [-1.0]},
            }
        ]
    )
    assert parse_choice(response.choices[0], "completions", SamplingParams()).logprobs is None


def test_other_finish_reasons_map_to_stop_and_none_content_is_empty() -> None:
    response = _chat_response(
        [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None},
                "finish_reason": "content_filter",
            }
        ]
    )
    c = parse_choice(response.choices[0], "chat", SamplingParams())
    assert c.text == "" and c.finish_reason == "stop"


def test_unhonoured_stop_is_cut_client_side_with_logprobs() -> None:
    response = _completion_response(
        [
            {
                "index": 0,
                "text": "42\n\nmore",
                "finish_reason": "length",
                "logprobs": {"tokens": ["42", "\n\n", "more"], "token_logprobs": [-1, -2, -3]},
            }
        ]
    )
    cut = parse_choice(
        response.choices[0], "completions", SamplingParams(stop=("\n\n",), logprobs=True)
    )
    assert (cut.text, cut.finish_reason, cut.stop_reason) == ("42", "stop", "\n\n")
    assert cut.logprobs == [-1.0]
    kept = parse_choice(
        response.choices[0],
        "completions",
        SamplingParams(stop=("\n\n",), include_stop=True, logprobs=True),
    )
    assert kept.text == "42\n\n" and kept.logprobs == [-1.0, -2.0]


def test_parse_response_orders_choices_by_index() -> None:
    response = _completion_response(
        [
            {"index": 1, "text": "b", "finish_reason": "stop"},
            {"index": 0, "text": "a", "finish_reason": "stop"},
        ]
    )
    assert [c.text for c in parse_response(response, "completions", SamplingParams(n=2))] == [
        "a",
        "b",
    ]


# ---------------------------------------------------------------------------------------------
# map_error
# ---------------------------------------------------------------------------------------------

_REQ = httpx.Request("POST", f"{URL}/completions")


def _status_error(cls: type[openai.APIStatusError], code: int, body: object = None) -> Exception:
    return cls(f"Error code: {code}", response=httpx.Response(code, request=_REQ), body=body)


def test_map_authentication_error() -> None:
    err = map_error(_status_error(openai.AuthenticationError, 401), URL, "m")
    assert err.problem == f"endpoint {URL} rejected the API key"
    assert err.fix == "pass --api-key or set COLLABRL_API_KEY"


def test_map_not_found_error() -> None:
    err = map_error(_status_error(openai.NotFoundError, 404), URL, "qwen")
    assert err.problem == f"model 'qwen' is not served at {URL}"
    assert err.fix == f"check `GET {URL}/models` for the served names"


@pytest.mark.parametrize(
    "exc", [openai.APIConnectionError(request=_REQ), openai.APITimeoutError(request=_REQ)]
)
def test_map_connection_errors(exc: Exception) -> None:
    err = map_error(exc, URL, "m")
    assert err.problem.startswith(f"cannot reach {URL}")
    assert err.fix is not None and "collab serve" in err.fix


def test_map_bad_request_uses_the_server_message() -> None:
    body = {"object": "error", "message": "max_tokens is too large", "code": 400}
    err = map_error(_status_error(openai.BadRequestError, 400, body), URL, "m")
    assert err.problem == f"{URL} rejected the request: max_tokens is too large"


def test_map_other_status_errors() -> None:
    err = map_error(_status_error(openai.InternalServerError, 503), URL, "m")
    assert err.problem.startswith(f"{URL} answered HTTP 503")
    err = map_error(_status_error(openai.RateLimitError, 429), URL, "m")
    assert err.problem.startswith(f"{URL} answered HTTP 429")


def test_map_error_is_one_line() -> None:
    body = {"message": "line one\nline two"}
    err = map_error(_status_error(openai.BadRequestError, 400, body), URL, "m")
    assert "\n" not in str(err)


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------


def test_api_key_fallback_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLABRL_API_KEY", "collab")
    monkeypatch.setenv("OPENAI_API_KEY", "openai")
    assert resolve_api_key("given") == "given"
    assert resolve_api_key(None) == "collab"
    monkeypatch.delenv("COLLABRL_API_KEY")
    assert resolve_api_key(None) == "openai"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert resolve_api_key(None) == "EMPTY"


def test_engine_uses_the_resolved_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLLABRL_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    engine = OpenAIEngine(URL, model="m")
    assert engine._client.api_key == "from-env"
    assert engine.name == f"openai:m@{URL}"
    assert isinstance(engine, Engine)
    engine.close()


def test_normalize_base_url() -> None:
    assert normalize_base_url("http://h:1") == "http://h:1/v1"
    assert normalize_base_url("http://h:1/") == "http://h:1/v1"
    assert normalize_base_url("http://h:1/v1/") == "http://h:1/v1"
    assert normalize_base_url("https://x.io/v1beta/openai") == "https://x.io/v1beta/openai"
    with pytest.raises(UserError):
        normalize_base_url("localhost:8000")


# ---------------------------------------------------------------------------------------------
# real HTTP: a canned OpenAI-compatible server from the standard library
# ---------------------------------------------------------------------------------------------


@dataclass
class _Server:
    """What a test sees of the canned server: its URL, the requests, the peak concurrency."""

    url: str
    seen: list[tuple[str, str, dict]] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Canned(BaseHTTPRequestHandler):
    """Answers /v1/models and /v1/completions; records every request it sees."""

    state: _Server  # set per server

    @property
    def seen(self) -> list[tuple[str, str, dict]]:
        return self.state.seen

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.seen.append(("GET", self.path, {}))
        if self.path == "/v1/models":
            self._reply(
                200,
                {
                    "object": "list",
                    "data": [{"id": "tiny", "object": "model", "created": 0, "owned_by": "me"}],
                },
            )
        else:
            self._reply(404, {"error": {"message": "no such route"}})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, body))
        if self.path != "/v1/completions":
            self._reply(404, {"error": {"message": "no such route"}})
            return
        if body["model"] != "tiny":
            self._reply(404, {"error": {"message": f"model {body['model']} not found"}})
            return
        if body["prompt"] == "slow":  # hold the request so concurrent ones overlap
            with self.state.lock:
                self.state.in_flight += 1
                self.state.peak = max(self.state.peak, self.state.in_flight)
            time.sleep(0.2)
            with self.state.lock:
                self.state.in_flight -= 1
        choices = [
            {"index": i, "text": f"hello {i}", "finish_reason": "length", "logprobs": None}
            for i in range(body.get("n", 1))
        ]
        self._reply(
            200,
            {
                "id": "cmpl-x",
                "object": "text_completion",
                "created": 0,
                "model": "tiny",
                "choices": choices,
                "usage": {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6},
            },
        )

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    state = _Server(url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Canned,), {"state": state}))
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_generate_against_a_real_local_server(server: _Server) -> None:
    url, seen = server.url, server.seen
    with OpenAIEngine(base_url=url, max_retries=0, timeout=10) as engine:
        assert engine.model is None
        [completions] = engine.generate(["hi"], SamplingParams(max_tokens=5, n=2, top_k=5))
        assert [c.text for c in completions] == ["hello 0", "hello 1"]
        assert all(c.finish_reason == "length" and c.prompt_tokens == 1 for c in completions)
        assert engine.model == "tiny"  # discovered with GET /v1/models
        assert engine.name == f"openai:tiny@{url}"
        # A second call runs on the same client: no re-discovery, no stale-loop errors.
        again = engine.generate(["a", "b"], SamplingParams(max_tokens=5))
        assert [[c.text for c in cs] for cs in again] == [["hello 0"], ["hello 0"]]
    assert [s[:2] for s in seen].count(("GET", "/v1/models")) == 1
    post = next(s[2] for s in seen if s[0] == "POST")
    assert post["prompt"] == "hi" and post["n"] == 2 and post["max_tokens"] == 5
    assert post["top_k"] == 5  # extra_body is merged into the JSON body


def test_generate_and_agenerate_inside_a_running_loop(server: _Server) -> None:
    url = server.url

    async def main(engine: OpenAIEngine) -> tuple[str, str]:
        sync = engine.generate(["x"], SamplingParams())  # blocking call from a coroutine
        async_ = await engine.agenerate(["y"], SamplingParams())
        return sync[0][0].text, async_[0][0].text

    with OpenAIEngine(base_url=url, model="tiny", max_retries=0, timeout=10) as engine:
        assert asyncio.run(main(engine)) == ("hello 0", "hello 0")
        assert asyncio.run(main(engine)) == ("hello 0", "hello 0")  # a second, fresh loop


def test_unknown_model_becomes_user_error(server: _Server) -> None:
    url = server.url
    with OpenAIEngine(base_url=url, model="nope", max_retries=0, timeout=10) as engine:
        with pytest.raises(UserError, match="model 'nope' is not served") as info:
            engine.generate(["hi"], SamplingParams())
    assert isinstance(info.value.__cause__, openai.NotFoundError)


def test_closed_port_is_reported_quickly() -> None:
    with socket.socket() as sock:  # grab a free port, then release it so nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    start = time.monotonic()
    with OpenAIEngine(base_url=url, max_retries=0, timeout=2) as engine:
        with pytest.raises(UserError, match="cannot reach") as info:
            engine.generate(["hi"], SamplingParams())
    assert time.monotonic() - start < 10
    assert url in str(info.value)


def test_concurrency_is_bounded(server: _Server) -> None:
    with OpenAIEngine(server.url, model="tiny", max_concurrency=2, max_retries=0) as engine:
        out = engine.generate(["slow"] * 6, SamplingParams())
    assert len(out) == 6
    assert server.peak == 2  # requests overlapped, but never more than the bound


def test_closed_engine_refuses_work() -> None:
    engine = OpenAIEngine(URL, model="m")
    engine.close()
    engine.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(["hi"], SamplingParams())


def test_a_policy_behind_a_text_only_server_is_marked_reencoded(
    server: _Server, smol_tokenizer
) -> None:
    """The canned server answers text only: the ids are the text encoded again, and the
    segment says so (trainers refuse it); the log-probs of other tokens are not kept."""
    from collabrl.protocols.base import Policy

    with OpenAIEngine(server.url, model="tiny", max_retries=0, timeout=10) as engine:
        policy = Policy(engine, smol_tokenizer, owns_engine=False)
        [segment] = policy.continue_([[1, 2, 3]], SamplingParams(max_tokens=50))
    assert segment.meta["reencoded"] is True
    assert segment.token_ids == smol_tokenizer("hello 0", add_special_tokens=False)["input_ids"]
    assert segment.logprobs is None
    post = next(body for method, _, body in server.seen if method == "POST")
    assert post["prompt"] == [1, 2, 3] and post["return_token_ids"] is True


def test_every_prompt_of_a_batch_gets_its_own_seed():
    # A server seeds each request alone: a shared seed makes a problem's samples equal.
    from collabrl.engines.openai_http import row_params

    params = SamplingParams(seed=7, temperature=1.0)
    assert [row_params(params, i).seed for i in range(3)] == [7, 8, 9]
    unseeded = SamplingParams(seed=None)
    assert row_params(unseeded, 5) is unseeded
