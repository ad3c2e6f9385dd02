"""The embedded server, started for real and queried with the official openai client."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.engines.templates import EMPTY_THINK, thinking_model_dir
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


def test_models_lists_the_role_name_then_the_model_reference(client, tiny_model_dir):
    assert [m.id for m in client.models.list().data] == ["expert", str(tiny_model_dir)]


def test_models_lists_exactly_the_names_a_404_offers(client):
    """A client that reads the 404's list, or /v1/models, finds the same names, and each
    of them is served (the model reference was accepted but never listed)."""
    listed = [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert err.value.body["param"] == "model"
    offered = err.value.body["message"].split("served: ", 1)[1].split(", ")
    assert offered == listed
    for name in listed:
        assert client.completions.create(model=name, prompt="x", max_tokens=1).choices


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
    with pytest.raises(openai.BadRequestError):  # logprobs are not streamed
        client.completions.create(model="expert", prompt="x", max_tokens=2, stream=True, logprobs=1)


def test_concurrent_requests_are_answered(client):
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


def test_sigterm_ends_a_busy_server_within_seconds(tiny_model_dir):
    """One request generating, three queued (about 40 s of work): SIGTERM answers them 503
    (clients retry elsewhere) and the process exits cleanly within seconds."""
    import threading

    proc = ServerProcess(tiny_model_dir).wait_ready()
    answers: list[int | str] = []

    def ask(seed: int) -> None:
        body = {"model": "expert", "prompt": "Hello", "max_tokens": 1900, "temperature": 0}
        try:
            reply = httpx.post(proc.url + "/completions", json={**body, "seed": seed}, timeout=60)
            answers.append(reply.status_code)
        except httpx.HTTPError as err:
            answers.append(type(err).__name__)

    clients = [threading.Thread(target=ask, args=(seed,)) for seed in range(4)]
    for client in clients:
        client.start()
    time.sleep(1.5)  # the first is generating, the others wait in the queue
    began = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    try:
        assert proc.proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert time.monotonic() - began < 5
    for client in clients:
        client.join(timeout=10)
    assert answers == [503] * 4


def test_a_second_ctrl_c_stops_as_cleanly_as_the_first(tiny_model_dir):
    """uvicorn's forced exit on a repeated SIGINT logged the cancelled lifespan's
    traceback; the shutdown is seconds long anyway, so the repeat changes nothing."""
    import threading

    proc = ServerProcess(tiny_model_dir).wait_ready()
    body = {"model": "expert", "prompt": "Hello", "max_tokens": 1900, "temperature": 0}
    asking = threading.Thread(
        target=lambda: httpx.post(proc.url + "/completions", json=body, timeout=60)
    )
    asking.start()
    time.sleep(1.0)  # generating
    try:
        proc.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.proc.send_signal(signal.SIGINT)
        assert proc.proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    asking.join(timeout=10)
    time.sleep(0.2)  # the reader thread takes the last lines
    log = "".join(proc.lines)
    assert "Traceback" not in log and "ERROR" not in log, log
    assert proc.lines[-1].strip() == "stopped"


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


# --- bad input -----------------------------------------------------------------------------------

AUTH = {"Authorization": "Bearer sk-test", "Content-Type": "application/json"}


def _post(server, path: str, body: bytes | dict, timeout: float = 60) -> httpx.Response:
    if isinstance(body, dict):
        return httpx.post(server.url + path, json=body, headers=AUTH, timeout=timeout)
    return httpx.post(server.url + path, content=body, headers=AUTH, timeout=timeout)


def _openai_error(reply: httpx.Response, status: int) -> dict:
    """The body of an error answered in OpenAI's shape, with the expected status."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/chat/completions",
            b'{"model": "expert", "messages": [{"role": "user", "content": "a\\ud800"}]}',
        ),
        ("/completions", b'{"model": "expert", "prompt": "\\ud800", "max_tokens": 2}'),
        ("/completions", b'{"model": "expert", "prompt": "x", "stop": ["\\udfff"]}'),
        (
            "/chat/completions",
            b'{"model": "expert", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        ),
    ],
)
def test_text_that_is_not_unicode_is_a_400(server, path: str, body: bytes) -> None:
    """A lone surrogate (JSON may spell one) or invalid UTF-8: 400, not a plain-text 500."""
    error = _openai_error(_post(server, path, body), 400)
    assert error["type"] == "BadRequestError"
    assert _post(
        server, "/completions", {"model": "expert", "prompt": "ok", "max_tokens": 2}
    ).is_success


def test_a_seed_beyond_64_bits_is_a_400_as_in_vllm(server, client) -> None:
    """2**70 reached torch's generator and came back a 500."""
    for seed in (2**70, -(2**63) - 1):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="expert", prompt="x", max_tokens=2, seed=seed)
        assert err.value.status_code == 400
        body = {"model": "expert", "prompt": "x", "max_tokens": 2, "seed": seed}
        assert _openai_error(_post(server, "/completions", body), 400)["param"] == "seed"
    for seed in (2**63 - 1, -(2**63)):  # vLLM's bounds, which torch takes
        client.completions.create(model="expert", prompt="x", max_tokens=2, seed=seed, n=2)


def test_a_message_of_a_role_no_template_knows_is_a_400(server, client) -> None:
    messages = [{"role": "oracle", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="expert", messages=messages, max_tokens=2)
    assert "role" in str(err.value)
    body = {"model": "expert", "messages": messages, "max_tokens": 2}
    error = _openai_error(_post(server, "/chat/completions", body), 400)
    assert error["param"] == "messages.0.role"


def test_a_prompt_longer_than_the_context_is_refused_before_it_is_queued(server) -> None:
    """A 1 MB prompt once held the server for eleven minutes: now a 400 at once."""
    began = time.monotonic()
    huge = _post(server, "/completions", {"model": "expert", "prompt": "ab " * 350_000})
    assert time.monotonic() - began < 10
    assert "maximum context length is 2048 tokens" in _openai_error(huge, 400)["message"]
    # Under the character bound but over the context in tokens (about 3000).
    messages = [{"role": "user", "content": "hello " * 3000}]
    long = _post(server, "/chat/completions", {"model": "expert", "messages": messages})
    error = _openai_error(long, 400)
    assert "tokens" in error["message"] and error["param"] == "messages"


def test_max_tokens_beyond_the_context_and_unknown_ids_are_refused(server) -> None:
    too_many = _post(
        server, "/completions", {"model": "expert", "prompt": "Hi", "max_tokens": 2048}
    )
    error = _openai_error(too_many, 400)
    assert error["param"] == "max_tokens" and "2048" in error["message"]
    unknown = _post(
        server, "/completions", {"model": "expert", "prompt": [1, 10**9], "max_tokens": 2}
    )
    assert "vocabulary" in _openai_error(unknown, 400)["message"]


# --- load ----------------------------------------------------------------------------------------


def test_abandoned_requests_are_dropped_from_the_queue(server) -> None:
    """Ten clients give up while queued; the next request does not wait for their work."""

    def ask(max_tokens: int, top_p: float, timeout: float) -> httpx.Response:
        body = {"model": "expert", "prompt": "Hello", "max_tokens": max_tokens, "top_p": top_p}
        return _post(server, "/completions", {**body, "temperature": 0}, timeout=timeout)

    with ThreadPoolExecutor(11) as pool:
        busy = pool.submit(ask, 400, 1.0, 120)  # holds the model for a few seconds
        time.sleep(0.5)
        # Distinct top-p (seeds would share a batch): each would be a batch of its own,
        # about 5 s of generation apiece.
        gone = [pool.submit(ask, 1000, 1 - i / 100, 0.5) for i in range(1, 11)]
        for future in gone:
            with pytest.raises(httpx.TimeoutException):
                future.result()
        began = time.monotonic()
        normal = ask(4, 1.0, 120)
        waited = time.monotonic() - began
        assert busy.result().status_code == 200
    assert normal.status_code == 200
    assert waited < 20, f"waited {waited:.1f} s: the abandoned requests were generated"


# --- what one client may ask of everyone's server -----------------------------------------------


def test_stop_strings_over_the_limits_are_a_400(server, client) -> None:
    """OpenAI takes at most 4 stop strings; so does this server by default, of at most 512
    characters each, and its 400 names the key that raises the limit."""
    ask = {"model": "expert", "prompt": "Hi", "max_tokens": 3}
    for stop, said in (
        ([f"s{i}" for i in range(5)], "at most 4 stop strings are accepted, got 5"),
        (["a" * 513], "at most 512 characters, got one of 513"),
        (["a", ""], "cannot be empty"),
    ):
        error = _openai_error(_post(server, "/completions", {**ask, "stop": stop}), 400)
        assert error["param"] == "stop" and said in error["message"], error
    with pytest.raises(openai.BadRequestError, match="max_stop_strings"):
        client.chat.completions.create(
            model="expert",
            messages=[{"role": "user", "content": "Hi"}],
            stop=[f"s{i}" for i in range(5)],
            stream=True,
        )
    at_limit = [chr(0x41 + i) * 512 for i in range(4)]
    chunks = list(client.completions.create(**ask, stop=at_limit, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


@pytest.fixture(scope="module")
def roomy_server(tiny_model_dir):
    """Stop-string limits raised 4 and 8 times over the defaults, as an operator may set
    them; warmed up by one stream."""
    limits = ("--set", "max_stop_strings=16", "--set", "max_stop_length=4096")
    with ServerProcess(tiny_model_dir, extra=limits) as proc:
        _latencies_beside_a_stream(proc, ["\x00"], max_tokens=20)
        yield proc


def _latencies_beside_a_stream(server, stop: list[str], max_tokens: int = 300) -> list[float]:
    """The seconds each `GET /v1/models` of a second client takes while one streamed
    completion with stop strings `stop` runs."""
    body = {
        "model": "expert",
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stop": stop,
    }
    first = threading.Event()

    def stream() -> int:
        try:
            with httpx.stream("POST", server.url + "/completions", json=body, timeout=300) as reply:
                assert reply.status_code == 200, reply.read()
                events = 0
                for line in reply.iter_lines():
                    events += line.startswith("data: {")
                    first.set()
                return events
        finally:
            first.set()

    latencies = []
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=60) as other:
        streaming = pool.submit(stream)
        first.wait(120)
        while not streaming.done():
            began = time.perf_counter()
            assert other.get(server.url + "/models").status_code == 200
            latencies.append(time.perf_counter() - began)
        events = streaming.result()
    assert events > max_tokens // 6, "the stream did not stream"
    return latencies


def test_long_stop_strings_do_not_hold_up_other_clients(roomy_server) -> None:
    """A stream's stop strings are checked at every token: checked over the whole text, on
    the event loop, 16 stop strings of 4096 characters held every other client for tens of
    milliseconds per token. A second client's requests now take, during such a stream, at
    most a few times what they take during a stream with as many short stop strings."""
    short = _latencies_beside_a_stream(roomy_server, [f"\x00{i:x}" for i in range(16)])
    long = _latencies_beside_a_stream(roomy_server, [" " + chr(1 + i) * 4095 for i in range(16)])
    assert len(short) > 20 and len(long) > 20
    ratio = statistics.median(long) / statistics.median(short)
    assert ratio < 3, f"{ratio:.1f} times slower beside long stop strings"


def test_a_path_or_header_cannot_forge_a_log_line(server) -> None:
    """A path's %0A reaches the app decoded, a newline; written as it came, it ended the
    request's log line and began one of the client's making. Control characters (and the
    quote that ends the logged request) are escaped: one request, one line. The user agent,
    hostile here too, is not logged at all."""
    marker = uuid.uuid4().hex
    forged = "INFO:%20%20%20%20%20127.0.0.1:1%20-%20%22GET%20/admin%20HTTP/1.1%22%20200"
    target = f"/v1/{marker}%0A{forged}%0D%1B[2J%22%5C%C2%85%E2%80%A8end"
    request = (
        f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        "User-Agent: \xc2\x85INFO: forged by the user agent\r\n\r\n"
    )
    before = len(server.lines)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request.encode("latin-1"))
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 404"), reply
    deadline = time.monotonic() + 10
    while not any(marker in line for line in server.lines):
        assert time.monotonic() < deadline, "".join(server.lines[-5:])
        time.sleep(0.1)
    time.sleep(0.2)  # a forged line would come with it
    logged = server.lines[before:]
    assert len(logged) == 1, logged
    [line] = logged
    assert "forged" not in "".join(server.lines)  # the user agent is not logged
    assert line.startswith("INFO:     127.0.0.1:")
    assert f"/v1/{marker}\\x0aINFO:     127.0.0.1:1 - \\x22GET /admin" in line
    assert '\\x0d\\x1b[2J\\x22\\x5c\\x85\\u2028end HTTP/1.1" 404 latency=' in line
    assert len(line.rstrip("\n").splitlines()) == 1


# --- token ids and chat-template options, on a model that ends at a token it writes -----------

POLICY_CHAT = [{"role": "user", "content": "Count."}]


@pytest.fixture(scope="module")
def eos_model(tiny_model_dir, tmp_path_factory):
    """The tiny model with the thinking template, and an EOS it reaches by itself: the 4th
    or a later token it writes greedily after POLICY_CHAT (so completions end at an EOS)."""
    from transformers import GenerationConfig

    from collabrl.engines.base import SamplingParams
    from collabrl.engines.hf import TransformersEngine

    folder = thinking_model_dir(tiny_model_dir, tmp_path_factory.mktemp("eos") / "model")
    engine = TransformersEngine.from_ref(str(folder))
    [[full]] = engine.generate([POLICY_CHAT], SamplingParams(max_tokens=12))
    k = next(i for i in range(3, 12) if full.token_ids[i] not in full.token_ids[:i])
    config = GenerationConfig.from_pretrained(folder)
    config.eos_token_id = [engine.tokenizer.eos_token_id, full.token_ids[k]]
    config.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def eos_server(eos_model):
    with ServerProcess(eos_model, role="policy") as proc:
        yield proc


def test_a_policy_over_http_records_the_ids_it_sampled(eos_model, eos_server):
    """The ids and log-probs from `collab serve` are the transformers engine's, EOS included."""
    from collabrl.engines.base import SamplingParams
    from collabrl.engines.hf import TransformersEngine
    from collabrl.engines.openai_http import OpenAIEngine
    from collabrl.protocols.base import Policy

    local = TransformersEngine.from_ref(str(eos_model))
    prompt = local.encode(POLICY_CHAT)
    params = SamplingParams(max_tokens=12, logprobs=True)
    [here] = Policy(local, local.tokenizer).continue_([prompt], params)
    assert here.meta["finish_reason"] == "stop" and len(here.token_ids) < 12
    assert here.token_ids[-1] in local.model.generation_config.eos_token_id  # kept, as sampled
    with OpenAIEngine(eos_server.url, max_retries=0, timeout=60) as remote:
        policy = Policy(remote, local.tokenizer, owns_engine=False)
        [there] = policy.continue_([prompt], params)
    assert there.token_ids == here.token_ids
    assert there.logprobs == pytest.approx(here.logprobs, abs=1e-4)
    assert there.meta["finish_reason"] == "stop" and "reencoded" not in there.meta


def test_token_ids_come_back_in_vllms_shapes(eos_server):
    body = {"model": "policy", "prompt": "Count:", "max_tokens": 5, "temperature": 0}
    new = httpx.post(eos_server.url + "/completions", json={**body, "return_token_ids": True})
    [choice] = new.json()["choices"]
    assert choice["prompt_token_ids"] and 1 <= len(choice["token_ids"]) <= 5
    old = httpx.post(
        eos_server.url + "/completions",
        json={**body, "logprobs": 1, "return_tokens_as_token_ids": True},
    )
    tokens = old.json()["choices"][0]["logprobs"]["tokens"]
    assert tokens == [f"token_id:{i}" for i in choice["token_ids"]]  # older vLLM's way
    chat = {"model": "policy", "messages": POLICY_CHAT, "max_tokens": 3, "return_token_ids": True}
    reply = httpx.post(eos_server.url + "/chat/completions", json=chat).json()
    assert reply["prompt_token_ids"] and reply["choices"][0]["token_ids"]


def test_chat_template_kwargs_per_request(eos_model, eos_server):
    """The HTTP engine sends the options; the server renders the chat with them."""
    from collabrl.engines.base import SamplingParams
    from collabrl.engines.openai_http import OpenAIEngine
    from collabrl.models import load_tokenizer

    tokenizer = load_tokenizer(str(eos_model))
    quiet = {"enable_thinking": False}
    expected = tokenizer.apply_chat_template(
        POLICY_CHAT, add_generation_prompt=True, tokenize=True, return_dict=False, **quiet
    )
    params = SamplingParams(max_tokens=2)
    with OpenAIEngine(eos_server.url, chat_template_kwargs=quiet, max_retries=0) as engine:
        [[c]] = engine.generate([POLICY_CHAT], params)
    with OpenAIEngine(eos_server.url, max_retries=0) as engine:
        [[thinking]] = engine.generate([POLICY_CHAT], params)
    assert c.prompt_tokens == len(expected) > thinking.prompt_tokens
    raw = {"model": "policy", "messages": POLICY_CHAT, "max_tokens": 2, "return_token_ids": True}
    reply = httpx.post(
        eos_server.url + "/chat/completions", json={**raw, "chat_template_kwargs": quiet}
    )
    assert tokenizer.decode(reply.json()["prompt_token_ids"]).endswith(EMPTY_THINK)


def test_add_generation_prompt_false_renders_without_the_assistant_header(eos_model, eos_server):
    """vLLM's `add_generation_prompt`: false leaves the template's assistant header out."""
    from collabrl.models import load_tokenizer

    tokenizer = load_tokenizer(str(eos_model))
    raw = {"model": "policy", "messages": POLICY_CHAT, "max_tokens": 2, "return_token_ids": True}
    for header in (True, False):
        reply = httpx.post(
            eos_server.url + "/chat/completions", json={**raw, "add_generation_prompt": header}
        )
        expected = tokenizer.apply_chat_template(
            POLICY_CHAT, add_generation_prompt=header, tokenize=True, return_dict=False
        )
        assert reply.json()["prompt_token_ids"] == expected, header


def test_a_remote_pool_sends_its_chat_template_kwargs(eos_server):
    from collabrl.config import EngineConfig, PoolConfig
    from collabrl.engines.base import SamplingParams
    from collabrl.engines.pool import ExpertPool

    calls = [(1, POLICY_CHAT)]
    params = SamplingParams(max_tokens=2)
    config = PoolConfig(endpoints=[eos_server.url], num_experts=1)
    with ExpertPool(config) as pool:
        [thinking] = pool.ask_sync(calls, params)
    quiet = EngineConfig(chat_template_kwargs={"enable_thinking": False})
    with ExpertPool(config, quiet) as pool:
        [record] = pool.ask_sync(calls, params)
    assert record.ok and record.prompt_tokens > thinking.prompt_tokens


@pytest.mark.slow  # the real SmolLM2, loaded twice: about 20 s
def test_smollm2_over_http_records_what_the_transformers_engine_does():
    """The real embedded model behind `collab serve`: a greedy policy turn over HTTP has
    the transformers engine's ids (its <|im_end|> EOS included) and log-probs."""
    from collabrl.engines.base import SamplingParams
    from collabrl.engines.hf import TransformersEngine
    from collabrl.engines.openai_http import OpenAIEngine
    from collabrl.protocols.base import Policy

    local = TransformersEngine.from_ref("smollm2-135m")
    prompt = local.encode([{"role": "user", "content": "What is the capital of France?"}])
    params = SamplingParams(max_tokens=24, logprobs=True)
    [here] = Policy(local, local.tokenizer).continue_([prompt], params)
    assert here.meta["finish_reason"] == "stop"
    assert here.token_ids[-1] == local.tokenizer.convert_tokens_to_ids("<|im_end|>")
    with ServerProcess("smollm2-135m", role="policy") as server:
        with OpenAIEngine(server.url, max_retries=0, timeout=120) as remote:
            policy = Policy(remote, local.tokenizer, owns_engine=False)
            [there] = policy.continue_([prompt], params)
    assert there.token_ids == here.token_ids and "reencoded" not in there.meta
    assert there.logprobs == pytest.approx(here.logprobs, abs=1e-4)


# --- what an OpenAI client expects: streams, a request log, no parameter dropped ------------


def _streamed_chat(client, **kwargs):
    return list(client.chat.completions.create(model="expert", stream=True, **kwargs))


def test_a_streamed_chat_is_the_unstreamed_reply_token_by_token(client, server):
    ask = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 40}
    whole = client.chat.completions.create(model="expert", temperature=0, **ask)
    chunks = _streamed_chat(client, temperature=0, stream_options={"include_usage": True}, **ask)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert "".join(pieces) == whole.choices[0].message.content
    assert len(pieces) > 5  # token by token, not the finished text at once
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == whole.choices[0].finish_reason and not any(finish[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_completions_carry_each_samples_index(client):
    ask = {"prompt": ["Once upon", "The cat"], "max_tokens": 12, "n": 2, "seed": 3}
    whole = client.completions.create(model="expert", temperature=1.0, **ask)
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in client.completions.create(model="expert", temperature=1.0, stream=True, **ask):
        assert chunk.object == "text_completion" and chunk.usage is None
        [choice] = chunk.choices
        texts[choice.index] = texts.get(choice.index, "") + choice.text
        if choice.finish_reason:
            finish[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}


def test_a_stream_never_sends_text_past_a_stop_string(client):
    greedy = client.completions.create(model="expert", prompt="The", max_tokens=16, temperature=0)
    stop = greedy.choices[0].text.strip()[3:6]
    assert stop
    ask = {"prompt": "The", "max_tokens": 16, "temperature": 0, "stop": [stop]}
    cut = client.completions.create(model="expert", **ask).choices[0]
    chunks = list(client.completions.create(model="expert", stream=True, **ask))
    assert "".join(c.choices[0].text for c in chunks) == cut.text
    assert chunks[-1].choices[0].finish_reason == "stop" == cut.finish_reason


def test_a_client_that_leaves_a_stream_stops_its_generation(server):
    """The log line of the request says the stream was closed, and the model is free at once
    rather than after the 1900 tokens that were asked for (about 4 s)."""
    body = {"model": "expert", "prompt": "Hello", "max_tokens": 1900, "stream": True}
    headers = {"Authorization": "Bearer sk-test"}
    with httpx.stream("POST", server.url + "/completions", json=body, headers=headers) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        next(reply.iter_lines())  # the first token's event: generating
    began = time.monotonic()
    after = _post(server, "/completions", {"model": "expert", "prompt": "x", "max_tokens": 1})
    assert after.status_code == 200
    assert time.monotonic() - began < 1.5
    deadline = time.monotonic() + 10
    while not any("client closed the stream" in line for line in server.lines):
        assert time.monotonic() < deadline, "".join(server.lines[-5:])
        time.sleep(0.1)


def test_a_stream_cut_by_a_shutdown_ends_with_an_error_event(tiny_model_dir):
    """The status was sent with the first chunk: the 503 comes as an error event, which the
    openai client raises."""
    proc = ServerProcess(tiny_model_dir).wait_ready()
    client = openai.OpenAI(base_url=proc.url, api_key="EMPTY", max_retries=0)
    try:
        stream = client.completions.create(
            model="expert", prompt="Hello", max_tokens=1900, stream=True
        )
        next(iter(stream))
        proc.proc.send_signal(signal.SIGTERM)
        with pytest.raises(openai.APIError, match="shutting down"):
            list(stream)
    finally:
        proc.kill()


def test_every_request_has_a_log_line(client, server):
    client.completions.create(model="expert", prompt="Once upon a time", max_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    deadline = time.monotonic() + 10
    pattern = re.compile(
        r'127\.0\.0\.1:\d+ - "POST /v1/completions HTTP/1\.1" 200 model=expert '
        r"prompt_tokens=4 completion_tokens=3 latency=\d+\.\d{3}s$"
    )
    while not (
        any(pattern.search(line) for line in server.lines)
        and any('"POST /v1/completions HTTP/1.1" 404 latency=' in line for line in server.lines)
    ):
        assert time.monotonic() < deadline, "".join(server.lines[-5:])
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("logit_bias", {"42": 5}),
        ("response_format", {"type": "json_object"}),
        ("frequency_penalty", 0.5),
        ("presence_penalty", 1.0),
        ("tool_choice", "auto"),  # without tools
    ],
)
def test_a_parameter_the_server_cannot_honour_is_a_400_naming_it(client, param, value):
    chat = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="expert", messages=chat, max_tokens=2, extra_body={param: value}
        )
    assert err.value.body["param"] == param


def test_parameters_at_their_neutral_values_are_accepted(client):
    reply = client.chat.completions.create(
        model="expert",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        frequency_penalty=0,
        presence_penalty=0.0,
        logit_bias={},
        response_format={"type": "text"},
        user="someone",  # changes nothing: ignored, as by vLLM
    )
    assert reply.choices[0].message.content is not None


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Today's weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tools_a_template_ignores_are_a_400(client):
    """SmolLM2's chat template has no place for tools: the model would never see them."""
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="expert",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER_TOOL],
            max_tokens=2,
        )
    assert err.value.body["param"] == "tools"


# A chat template that shows the tools in a system turn, as Qwen's and Llama 3's do.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tools_client(tiny_model_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tools") / "model"
    shutil.copytree(tiny_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TOOLS_TEMPLATE
    tokenizer.save_pretrained(folder)
    with ServerProcess(folder) as proc:
        yield openai.OpenAI(base_url=proc.url, api_key="EMPTY", max_retries=0)


def test_tools_reach_a_chat_template_that_renders_them(tools_client):
    chat = [{"role": "user", "content": "Weather in Paris?"}]

    def prompt_tokens(**tools) -> int:
        reply = tools_client.chat.completions.create(
            model="expert", messages=chat, max_tokens=1, **tools
        )
        return reply.usage.prompt_tokens

    plain = prompt_tokens()
    assert prompt_tokens(tools=[WEATHER_TOOL]) > plain + 20  # the tool's JSON is in the prompt
    assert prompt_tokens(tools=[WEATHER_TOOL], tool_choice="none") == plain
    with pytest.raises(openai.BadRequestError) as err:  # a forced call needs a parser
        prompt_tokens(tools=[WEATHER_TOOL], tool_choice="required")
    assert err.value.body["param"] == "tool_choice"


# --- what vLLM's server answers besides: prompt forms, echo, tokenizer, metrics, errors ------


def _prompt_logprobs_here(engine, ids: list[int]) -> list[float]:
    """Each token's log-prob after those before it, from one forward pass in this process."""
    import torch

    with torch.inference_mode():
        logits = engine.model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_every_prompt_form_vllm_takes(client, tiny_engine):
    """A text, texts, token ids, lists of token ids (lm-eval's default) are the same prompts."""
    ids = tiny_engine.encode("Once upon a time")

    def texts(prompt) -> list[str]:
        reply = client.completions.create(
            model="expert", prompt=prompt, max_tokens=4, temperature=0
        )
        return [c.text for c in sorted(reply.choices, key=lambda c: c.index)]

    [alone] = texts("Once upon a time")
    assert texts(["Once upon a time", "Once upon a time"]) == [alone, alone]
    assert texts(ids) == [alone]
    assert texts([ids, ids[:2]])[0] == alone
    with pytest.raises(openai.BadRequestError) as err:
        texts([ids, []])
    assert err.value.body["param"] == "prompt"


def test_echo_with_logprobs_scores_the_prompt_as_vllm_does(client, tiny_engine):
    """lm-eval's loglikelihood request: the prompt's tokens, each with its log-prob (the
    first null) and a map of the likeliest tokens that holds the token itself."""
    ids = tiny_engine.encode("The capital of France is Paris")
    reply = client.completions.create(
        model="expert", prompt=[ids], echo=True, logprobs=1, max_tokens=1, temperature=0
    )
    [choice] = reply.choices
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(ids) + 1  # the prompt, then the one generated token
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    here = _prompt_logprobs_here(tiny_engine, ids)
    assert logprobs.token_logprobs[1 : len(ids)] == pytest.approx(here, abs=1e-4)
    for token, value, top in zip(
        logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
    ):
        assert top[token] == value and 1 <= len(top) <= 2
        assert max(top.values()) >= value
    assert choice.text.startswith("The capital of France is Paris")
    assert logprobs.text_offset[:2] == [0, len(logprobs.tokens[0])]


def test_echo_without_generation(client):
    reply = client.completions.create(
        model="expert", prompt="Hello there", echo=True, logprobs=0, max_tokens=0
    )
    [choice] = reply.choices
    assert choice.text == "Hello there" and reply.usage.completion_tokens == 0
    assert choice.logprobs.token_logprobs[0] is None and len(choice.logprobs.tokens) == 2
    with pytest.raises(openai.BadRequestError) as err:  # nothing to answer without echo
        client.completions.create(model="expert", prompt="Hello", max_tokens=0)
    assert err.value.body["param"] == "max_tokens"


def test_logprobs_of_a_completion_carry_the_likeliest_tokens(client):
    reply = client.completions.create(
        model="expert", prompt="Hello", max_tokens=4, logprobs=3, temperature=0.8, seed=3
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.top_logprobs) >= 1
    for token, value, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert top[token] == value and len(top) <= 4


def test_chat_top_logprobs_lists_the_likeliest_tokens_as_openai_does(client):
    reply = client.chat.completions.create(
        model="expert",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) >= 1
    for place in content:
        assert len(place.top_logprobs) == 3
        values = [t.logprob for t in place.top_logprobs]
        assert values == sorted(values, reverse=True)
        # Greedy: the sampled token is the likeliest, with the same log-prob.
        assert place.top_logprobs[0].token == place.token
        assert place.top_logprobs[0].logprob == pytest.approx(place.logprob, abs=1e-4)
        assert place.top_logprobs[0].bytes == list(place.token.encode())


@pytest.mark.parametrize("extra", [{"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}])
def test_chat_top_logprobs_without_logprobs_or_past_the_cap_is_a_400(client, extra):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="expert",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
            extra_body=extra,
        )
    assert err.value.body["param"] == "top_logprobs"


AUTH = {"Authorization": "Bearer sk-test"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": 21}, "logprobs"),  # vLLM's --max-logprobs
        ({"echo": True, "stream": True}, "echo"),
    ],
)
def test_what_vllm_also_refuses_is_a_400(server, extra, param):
    body = {"model": "expert", "prompt": "Hi", "max_tokens": 2, **extra}
    reply = httpx.post(server.url + "/completions", json=body, headers=AUTH, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param


def test_tokenize_and_detokenize_as_vllm(server, tiny_engine):
    root = server.url.removesuffix("/v1")
    text = "Hello world"
    reply = httpx.post(
        root + "/tokenize",
        json={"prompt": text, "add_special_tokens": False, "return_token_strs": True},
        headers=AUTH,
    ).json()
    ids = tiny_engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert reply == {
        "count": len(ids),
        "max_model_len": tiny_engine.context_length,
        "tokens": ids,
        "token_strs": tiny_engine.tokenizer.convert_ids_to_tokens(ids),
    }
    chat = [{"role": "user", "content": "Hi"}]
    rendered = httpx.post(root + "/tokenize", json={"messages": chat}, headers=AUTH).json()
    assert rendered["tokens"] == tiny_engine.encode(chat)  # as /v1/chat/completions renders it
    back = httpx.post(root + "/detokenize", json={"tokens": ids}, headers=AUTH).json()
    assert back == {"prompt": text}
    wrong = httpx.post(root + "/detokenize", json={"model": "nope", "tokens": ids}, headers=AUTH)
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
    assert httpx.post(root + "/tokenize", json={"prompt": text}).status_code == 401


def test_tokenizer_info_as_vllm(server, tiny_engine):
    info = httpx.get(server.url.removesuffix("/v1") + "/tokenizer_info", headers=AUTH).json()
    tokenizer = tiny_engine.tokenizer
    assert info["eos_token"] == tokenizer.eos_token and info["bos_token"] == tokenizer.bos_token
    assert info["tokenizer_class"] == type(tokenizer).__name__
    assert info["chat_template"] == tokenizer.chat_template
    assert not any(key.endswith("_file") for key in info)  # no paths of the server's files


def test_a_path_no_route_serves_is_a_404_in_openais_shape(server):
    reply = httpx.post(server.url + "/embeddings", json={}, headers=AUTH)
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "NotFoundError" and error["code"] == 404
    assert "/v1/completions" in error["message"]  # it names what is served
    wrong_method = httpx.get(server.url + "/completions", headers=AUTH)
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == 405


def test_a_refused_request_logs_its_reason(client, server):
    marker = f"no-such-model-{uuid.uuid4().hex}"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=marker, prompt="x", max_tokens=1)
    deadline = time.monotonic() + 10
    while not any(marker in line for line in server.lines):
        assert time.monotonic() < deadline, "".join(server.lines[-5:])
        time.sleep(0.1)
    [line] = [line for line in server.lines if marker in line]
    assert '"POST /v1/completions HTTP/1.1" 404 latency=' in line
    assert f"error=\"model '{marker}' does not exist; served: expert" in line


def test_metrics_in_prometheus_text(client, server):
    """`curl /metrics`: vLLM's names, no key needed (as /health and vLLM's)."""
    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict[str, float]:
        reply = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=10)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
        return {
            sample.name + str(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(reply.text)
            for sample in family.samples
        }

    def value(samples: dict[str, float], name: str, **labels: str) -> float:
        return samples.get(name + str(sorted(labels.items())), 0.0)

    before = scrape()
    reply = client.completions.create(model="expert", prompt="Once", max_tokens=3, n=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    after = scrape()
    model = {"model_name": "expert"}
    for name, grown in (
        ("vllm:prompt_tokens_total", reply.usage.prompt_tokens),
        ("vllm:generation_tokens_total", reply.usage.completion_tokens),
        ("vllm:e2e_request_latency_seconds_count", 1),
    ):
        assert value(after, name, **model) - value(before, name, **model) == grown, name
    finished = sum(
        value(after, "vllm:request_success_total", finished_reason=reason, **model)
        - value(before, "vllm:request_success_total", finished_reason=reason, **model)
        for reason in ("stop", "length")
    )
    assert finished == 2  # one per choice
    http = {"handler": "/v1/completions", "method": "POST"}
    assert value(after, "http_requests_total", status="4xx", **http) > value(
        before, "http_requests_total", status="4xx", **http
    )
    assert value(after, "vllm:num_requests_waiting", **model) == 0
