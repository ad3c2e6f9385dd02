"""The embedded server, started for real and queried with the official openai client."""

from __future__ import annotations

import signal
import time

import httpx
import openai
import pytest

from tests.servers import ServerProcess


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with ServerProcess(tiny_model_dir, api_key="sk-test") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="sk-test", max_retries=0)


def test_ready_line_names_the_base_url(server):
    assert any(line.startswith(f"ready: {server.url}") for line in server.lines)


def test_health_needs_no_key(server):
    reply = httpx.get(server.url.removesuffix("/v1") + "/health", timeout=10)
    assert reply.status_code == 200 and reply.json() == {"status": "ok"}


def test_models_lists_the_role_name(client):
    assert [m.id for m in client.models.list().data] == ["expert"]


def test_wrong_or_missing_key_is_401(server):
    for key in ("wrong", "EMPTY"):
        bad = openai.OpenAI(base_url=server.url, api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            bad.models.list()
        assert err.value.status_code == 401
    raw = httpx.post(server.url + "/completions", json={"model": "expert", "prompt": "x"})
    assert raw.status_code == 401


def test_chat_completion_with_usage(client):
    reply = client.chat.completions.create(
        model="expert",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=6,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert reply.usage.completion_tokens >= 1
    assert reply.usage.prompt_tokens > 3  # the chat template adds role markers
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_completion_n_samples_and_usage(client):
    reply = client.completions.create(
        model="expert", prompt="Once upon a time", max_tokens=5, n=3, temperature=1.0, seed=1
    )
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert all(c.finish_reason in ("length", "stop") for c in reply.choices)
    assert reply.usage.completion_tokens <= 15
    assert reply.usage.prompt_tokens == 4  # counted once for the prompt, not per sample


def test_stop_strings_are_honoured(client):
    greedy = (
        client.completions.create(model="expert", prompt="The", max_tokens=12, temperature=0)
        .choices[0]
        .text
    )
    stop = greedy.strip()[2:5]
    assert stop, greedy
    cut = client.completions.create(
        model="expert", prompt="The", max_tokens=12, temperature=0, stop=[stop]
    ).choices[0]
    assert stop not in cut.text and greedy.startswith(cut.text)
    assert cut.finish_reason == "stop"


def test_same_seed_same_sample(client):
    def sample():
        return (
            client.completions.create(
                model="expert", prompt="A", max_tokens=8, temperature=1.0, seed=7
            )
            .choices[0]
            .text
        )

    assert sample() == sample()


def test_unknown_model_is_404_and_bad_request_is_400(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="expert", prompt="x", max_tokens=2, top_p=5)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="expert", prompt="x", max_tokens=2, stream=True)


def test_concurrent_requests_are_answered(client):
    from concurrent.futures import ThreadPoolExecutor

    def ask(i: int) -> str:
        return (
            client.completions.create(
                model="expert", prompt=f"Item {i}", max_tokens=4, temperature=0
            )
            .choices[0]
            .text
        )

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, range(8)))
    assert len(texts) == 8 and all(isinstance(t, str) for t in texts)


def test_sigterm_shuts_down_gracefully(tiny_model_dir):
    proc = ServerProcess(tiny_model_dir).wait_ready()
    proc.proc.send_signal(signal.SIGTERM)
    began = time.monotonic()
    assert proc.proc.wait(timeout=30) == 0
    assert time.monotonic() - began < 30


def test_port_in_use_is_a_one_line_error(tiny_model_dir, server):
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "collabrl.cli.main",
            "serve",
            "expert",
            "--model",
            str(tiny_model_dir),
            "--engine",
            "transformers",
            "--port",
            str(server.port),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "--port" in done.stderr


def test_continuing_a_final_assistant_message(client, tiny_model_dir):
    """vLLM's continue_final_message: the reply continues the partial assistant text."""
    from collabrl.engines.base import SamplingParams
    from collabrl.engines.hf import TransformersEngine

    messages = [
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": "One, two,"},
    ]
    reply = client.chat.completions.create(
        model="expert",
        messages=messages,
        max_tokens=5,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    # The same continuation as the engine gives for the same messages, in process.
    local = TransformersEngine.from_ref(str(tiny_model_dir))
    [[expected]] = local.generate([messages], SamplingParams(max_tokens=5))
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.prompt_tokens == len(local.encode(messages))


def test_continuation_flag_must_match_the_last_message(client):
    for messages, flag in (
        ([{"role": "user", "content": "Hi"}], True),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "He"}], False),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="expert",
                messages=messages,
                max_tokens=2,
                extra_body={"continue_final_message": flag},
            )
        assert "continue_final_message" in str(err.value)
