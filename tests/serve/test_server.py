"""Tests for collabrl.serve.server's choice of engine: the rule every command follows."""

from __future__ import annotations

import socket

import pytest

from collabrl.config import EngineConfig
from collabrl.engines import AUTO_ENGINE_ENV
from collabrl.errors import UserError
from collabrl.serve.config import ServeConfig
from collabrl.serve.server import check_address, choose_engine, served_context


def _config(model: str = "smollm2-135m", kind: str = "auto") -> ServeConfig:
    return ServeConfig(model=model, engine=EngineConfig(kind=kind))


@pytest.mark.parametrize("kind", ["vllm", "transformers"])
def test_a_named_engine_is_served_with(kind: str) -> None:
    assert choose_engine(_config(kind=kind)) == kind


def test_auto_keeps_transformers_where_the_environment_says_so(monkeypatch) -> None:
    monkeypatch.setenv(AUTO_ENGINE_ENV, "transformers")
    assert choose_engine(_config()) == "transformers"


def test_auto_follows_vllm_can_run(monkeypatch) -> None:
    from collabrl.engines import vllm

    monkeypatch.delenv(AUTO_ENGINE_ENV, raising=False)
    for can_run, kind in ((True, "vllm"), (False, "transformers")):
        monkeypatch.setattr(vllm, "vllm_can_run", lambda can_run=can_run: can_run)
        assert choose_engine(_config()) == kind


def test_an_endpoint_url_is_not_a_model_to_serve() -> None:
    with pytest.raises(UserError, match="serves a local model"):
        choose_engine(_config(model="http://127.0.0.1:8000/v1"))


def test_a_port_in_use_is_refused_before_the_model_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}: Address already"):
            check_address("127.0.0.1", port)


def test_the_served_context_is_the_models_or_a_shorter_one_asked_for() -> None:
    assert served_context(2048, None) == 2048
    assert served_context(2048, 512) == 512
    assert served_context(None, 512) == 512  # a model that does not say takes what is asked
    with pytest.raises(UserError, match="longer than the model's context of 2048"):
        served_context(2048, 4096)  # as vLLM refuses it


def test_max_model_len_caps_what_the_embedded_server_takes(tiny_model_dir) -> None:
    """The context the server tells /tokenize and refuses prompts by is --max-model-len."""
    import httpx

    from tests.servers import ServerProcess

    with ServerProcess(tiny_model_dir, extra=("--max-model-len", "16")) as server:
        root = server.url.removesuffix("/v1")
        reply = httpx.post(root + "/tokenize", json={"prompt": "Hi"}, timeout=30).json()
        assert reply["max_model_len"] == 16
        body = {"model": "expert", "prompt": "Hi", "max_tokens": 40}
        too_long = httpx.post(server.url + "/completions", json=body, timeout=30)
        assert too_long.status_code == 400
        assert "maximum context length is 16 tokens" in too_long.json()["error"]["message"]
