"""Tests for collabrl.serve.server's choice of engine: the rule every command follows."""

from __future__ import annotations

import socket

import pytest

from collabrl.config import EngineConfig
from collabrl.engines import AUTO_ENGINE_ENV
from collabrl.errors import UserError
from collabrl.serve.config import ServeConfig
from collabrl.serve.server import check_address, choose_engine


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
