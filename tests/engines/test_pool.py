"""The expert pool: routing, batching, retries, the cache, and real servers dying."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from pathlib import Path

import pytest

from collabrl.config import EngineConfig, PoolConfig, build_config
from collabrl.engines.base import SamplingParams
from collabrl.engines.calls import UNKNOWN_EXPERT, Call, CallRecord, stats
from collabrl.engines.endpoints import endpoint_index
from collabrl.engines.pool import NO_REFERENCE, ExpertPool
from collabrl.engines.reference import REFERENCE, Reference, reference_completion
from collabrl.engines.response_cache import ResponseCache
from collabrl.engines.retry import is_transient
from collabrl.errors import UserError
from tests.engines.templates import thinking_model_dir
from tests.servers import ServerProcess, free_port

SHORT = SamplingParams(max_tokens=8)
CHAT = [{"role": "user", "content": "What is 2+2?"}]
THREE = [(1, "The capital of France is"), (2, CHAT), (3, "Once upon a time")]


# --- configuration and routing (no model) ------------------------------------------------------


def test_round_robin_and_per_expert_assignment() -> None:
    urls = ["http://a:1/v1", "http://b:2/v1"]
    pool = ExpertPool(PoolConfig(endpoints=urls, num_experts=3))
    assert [pool.endpoint_for(i).ref for i in (1, 2, 3)] == [urls[0], urls[1], urls[0]]
    assert pool.endpoint_for(0) is None and pool.endpoint_for(4) is None
    three = [*urls, "http://c:3/v1"]
    per = ExpertPool(PoolConfig(endpoints=three, num_experts=3, assignment="per_expert"))
    assert [per.endpoint_for(i).ref for i in (1, 2, 3)] == three
    pool.close()
    per.close()


def test_endpoint_index_rejects_ids_outside_one_to_k() -> None:
    assert [endpoint_index(i, 3, 1) for i in (1, 2, 3)] == [0, 0, 0]
    assert [endpoint_index(i, 3, 1) for i in (0, -1, 4, True)] == [None] * 4


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"assignment": "per_expert"}, "per_expert assignment needs one endpoint per expert"),
        ({"endpoints": []}, "no endpoints"),
        ({"num_experts": 0}, "num_experts"),
        ({"assignment": "random"}, "unknown expert assignment"),
        ({"timeout": 0.0}, "timeout"),
        ({"retries": -1}, "retries"),
    ],
)
def test_bad_pool_configs_are_user_errors(changes: dict, message: str) -> None:
    config = dataclasses.replace(
        PoolConfig(endpoints=["http://a:1/v1", "http://b:2/v1"]), **changes
    )
    with pytest.raises(UserError, match=message):
        ExpertPool(config)


def test_pool_config_builds_from_layers() -> None:
    config = build_config(
        PoolConfig, [{"endpoints": ["http://a:1/v1"], "timeout": 5}], ["num_experts=2"]
    )
    assert config.endpoints == ["http://a:1/v1"] and config.timeout == 5.0
    assert config.num_experts == 2 and config.cache_dir is None


def test_transient_errors_are_retried_and_final_ones_are_not() -> None:
    assert is_transient(TimeoutError(), local=False)
    assert not is_transient(TimeoutError(), local=True)  # the model is still busy with it
    assert is_transient(ConnectionResetError(), local=False)
    assert not is_transient(UserError("unknown model 'x'"), local=True)
    assert not is_transient(ValueError("bad prompt"), local=False)


def test_stats_summarises_records() -> None:
    records = [
        CallRecord(
            1, "e", "p", "a", "ok", latency_s=1.0, prompt_tokens=3, completion_tokens=4, attempts=1
        ),
        CallRecord(2, "e", "p", None, "unavailable", "down", latency_s=3.0, attempts=2),
        CallRecord(3, "e", "p", "a", "cached", prompt_tokens=3, completion_tokens=4),
        CallRecord(9, "", "p", None, "unavailable", UNKNOWN_EXPERT),
    ]
    assert stats(records) == {
        "calls": 4,
        "ok": 1,
        "unavailable": 2,
        "cached": 1,
        "mean_latency_s": 2.0,
        "prompt_tokens": 6,
        "completion_tokens": 8,
    }
    assert stats([])["mean_latency_s"] == 0.0
    assert [r.ok for r in records] == [True, False, True, False]


def test_params_with_several_samples_are_refused() -> None:
    with ExpertPool(PoolConfig(endpoints=["http://a:1/v1"])) as pool:
        with pytest.raises(ValueError, match="n must be 1"):
            pool.ask_sync([(1, "x")], SamplingParams(n=2))


# --- the reference stand-in (no model) ---------------------------------------------------------


def test_reference_stand_in_answers_from_the_call_reference(smol_tokenizer) -> None:
    reference = Reference("4", "Two and two make four.")
    config = PoolConfig(endpoints=[REFERENCE], num_experts=2)
    with ExpertPool(config, tokenizer=smol_tokenizer) as pool:
        records = pool.ask_sync(
            [Call(1, CHAT, reference), (2, CHAT, Reference("5")), Call(2, CHAT)],
            SamplingParams(max_tokens=100),
        )
        assert pool.generate_calls == 0  # no engine was built or asked
    full, short, missing = records
    assert full.outcome == "ok" and full.finish_reason == "stop"
    assert full.text == reference_completion(reference, 100, smol_tokenizer).text
    assert full.endpoint == short.endpoint == missing.endpoint == "reference (stand-in)"
    assert full.completion_tokens == len(smol_tokenizer.encode(full.text, add_special_tokens=False))
    assert short.text == "The final answer is $\\boxed{5}$."
    # A call without a reference: a record, not an exception.
    assert (missing.outcome, missing.text, missing.error) == ("unavailable", None, NO_REFERENCE)


def test_a_fallible_stand_in_is_named_as_given_and_misses_what_it_does_not_know(
    smol_tokenizer,
) -> None:
    config = PoolConfig(endpoints=["reference@0"], num_experts=1)
    with ExpertPool(config, tokenizer=smol_tokenizer) as pool:
        [record] = pool.ask_sync([Call(1, CHAT, Reference("40", key="a"))], SamplingParams())
    assert record.endpoint == "reference@0 (stand-in)" and record.outcome == "ok"
    assert "\\boxed{40}" not in record.text and "\\boxed{4" in record.text


def test_reference_stand_in_is_cut_to_max_tokens_and_never_cached(
    smol_tokenizer, tmp_path: Path
) -> None:
    config = PoolConfig(endpoints=[REFERENCE], cache_dir=str(tmp_path / "cache"))
    with ExpertPool(config, tokenizer=smol_tokenizer) as pool:
        [cut] = pool.ask_sync([Call(1, "x", Reference("1234"))], SamplingParams(max_tokens=3))
    assert cut.outcome == "ok" and cut.finish_reason == "length" and cut.completion_tokens == 3
    assert not (tmp_path / "cache").exists()


# --- endpoints that fail without a model ------------------------------------------------------


def test_refused_connection_is_unavailable_after_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    config = PoolConfig(endpoints=[url], retries=2, backoff=0.05, served_model="expert")
    with ExpertPool(config) as pool:
        records = pool.ask_sync(THREE, SHORT)
    assert [r.outcome for r in records] == ["unavailable"] * 3
    assert all("cannot reach" in r.error and r.attempts == 3 for r in records)


def test_silent_server_times_out_per_attempt() -> None:
    with socket.socket() as silent:  # accepts connections (kernel backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        config = PoolConfig(
            endpoints=[url], timeout=0.5, retries=1, backoff=0.1, served_model="expert"
        )
        with ExpertPool(config) as pool:
            began = time.monotonic()
            records = pool.ask_sync(THREE, SHORT)
            elapsed = time.monotonic() - began
    assert all(r.outcome == "unavailable" and r.attempts == 2 for r in records)
    assert all(r.error == "no answer within 0.5 s" for r in records)
    assert elapsed < 0.5 * 2 + 0.1 + 3.0


def test_bad_local_model_ref_is_unavailable(tmp_path: Path) -> None:
    with ExpertPool(PoolConfig(endpoints=[str(tmp_path / "missing")])) as pool:
        records = pool.ask_sync(THREE, SHORT)
    assert all(r.outcome == "unavailable" and "unknown model" in r.error for r in records)


# --- in-process experts on the tiny model ------------------------------------------------------


@pytest.fixture(scope="module")
def local_pool(tiny_model_dir: Path):
    with ExpertPool(PoolConfig(endpoints=[str(tiny_model_dir)], num_experts=3)) as pool:
        yield pool


def test_three_local_experts_share_one_batched_generate(local_pool: ExpertPool) -> None:
    before = local_pool.generate_calls
    records = local_pool.ask_sync(THREE, SHORT)
    assert local_pool.generate_calls == before + 1  # one engine, one batch
    assert [r.expert_id for r in records] == [1, 2, 3]
    assert [r.prompt for r in records] == [p for _, p in THREE]
    assert {r.endpoint for r in records} == {local_pool.endpoints[0].ref}
    for r in records:
        assert r.outcome == "ok" and r.ok and r.error is None and r.attempts == 1
        assert isinstance(r.text, str) and 1 <= r.completion_tokens <= 8
        assert r.prompt_tokens > 0 and r.latency_s > 0


def test_local_batch_matches_single_calls(local_pool: ExpertPool) -> None:
    together = local_pool.ask_sync(THREE, SHORT)
    alone = [local_pool.ask_sync([call], SHORT)[0] for call in THREE]
    assert [r.text for r in together] == [r.text for r in alone]


def test_unknown_expert_ids_are_unavailable(local_pool: ExpertPool) -> None:
    records = local_pool.ask_sync([(0, "x"), (4, "x"), (2, "Hello"), (-1, "x")], SHORT)
    assert [r.outcome for r in records] == ["unavailable", "unavailable", "ok", "unavailable"]
    assert all(r.error == UNKNOWN_EXPERT and r.attempts == 0 for r in records if not r.ok)


def test_malformed_prompt_fails_alone(local_pool: ExpertPool) -> None:
    records = local_pool.ask_sync([(1, []), (2, "Hello")], SHORT)
    assert records[0].outcome == "unavailable" and "invalid prompt" in records[0].error
    assert records[1].outcome == "ok"


def test_concurrent_asks_from_a_running_loop(local_pool: ExpertPool) -> None:
    async def both() -> tuple[list[CallRecord], list[CallRecord], list[CallRecord]]:
        first, second = await asyncio.gather(
            local_pool.ask(THREE[:2], SHORT), local_pool.ask(THREE[2:], SHORT)
        )
        return first, second, local_pool.ask_sync(THREE[:1], SHORT)  # works inside a loop too

    before = local_pool.generate_calls
    first, second, third = asyncio.run(both())
    assert all(r.outcome == "ok" for r in [*first, *second, *third])
    assert local_pool.generate_calls == before + 3


def test_calls_differing_only_in_length_share_one_batch(local_pool: ExpertPool) -> None:
    """A relay round's teacher calls each ask for their own n: one batch, not one each."""
    two, five = dataclasses.replace(SHORT, max_tokens=2), dataclasses.replace(SHORT, max_tokens=5)
    before = local_pool.generate_calls
    *short, last = local_pool.ask_each_sync(THREE, [two, two, five])
    long = [last]
    assert local_pool.generate_calls == before + 1
    assert [r.expert_id for r in short] == [1, 2] and [r.expert_id for r in long] == [3]
    assert all(r.ok and r.completion_tokens <= 2 for r in short)
    # Each answer is the one its call gets alone.
    assert [r.text for r in short] == [r.text for r in local_pool.ask_sync(THREE[:2], two)]
    assert long[0].ok and long[0].text == local_pool.ask_sync(THREE[2:], five)[0].text


def test_calls_with_other_different_params_each_get_their_own(local_pool: ExpertPool) -> None:
    greedy = dataclasses.replace(SHORT, max_tokens=3)
    hot = dataclasses.replace(SHORT, max_tokens=3, temperature=0.9, seed=1)
    before = local_pool.generate_calls
    records = local_pool.ask_each_sync(THREE, [greedy, greedy, hot])
    assert all(r.ok for r in records)
    assert local_pool.generate_calls == before + 2


class _Recorder:
    """A local engine that keeps the prompts and params of every generate."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.calls: list[tuple[list, SamplingParams]] = []

    def generate(self, prompts, params: SamplingParams):
        self.calls.append((list(prompts), params))
        return self.inner.generate(prompts, params)

    def close(self) -> None:  # the session's shared engine stays open
        pass


def test_calls_differing_in_budget_and_seed_are_one_generate_each_with_its_own(
    tiny_engine, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool merges the group's params: one generate, each prompt with its call's
    budget and seed, answered and cached as the call alone would be."""
    recorder = _Recorder(tiny_engine)
    monkeypatch.setattr("collabrl.engines.pool.create_engine", lambda ref, config: recorder)
    hot = SamplingParams(temperature=1.0)
    own = [dataclasses.replace(hot, max_tokens=b, seed=s) for b, s in [(3, 10), (7, 11), (5, 12)]]
    cached = PoolConfig(endpoints=[str(tiny_model_dir)], num_experts=3, cache_dir=str(tmp_path))
    with ExpertPool(cached) as pool:
        together = pool.ask_each_sync(THREE, own)
        [(prompts, params)] = recorder.calls
        assert prompts == [p for _, p in THREE]
        assert (params.budgets, params.seeds, params.max_tokens) == ((3, 7, 5), (10, 11, 12), 7)
        assert [r.completion_tokens for r in together] == [3, 7, 5]
        # Each answer is cached under its own call's budget and seed; `ask` with one
        # params carrying the budgets (and seed + i) asks for the very same calls.
        batch = dataclasses.replace(hot, seed=10, budgets=(3, 7, 5))
        for again in (pool.ask_each_sync(THREE, own), pool.ask_sync(THREE, batch)):
            assert [r.outcome for r in again] == ["cached"] * 3
            assert [r.text for r in again] == [r.text for r in together]
        assert len(recorder.calls) == 1
        [longer] = pool.ask_each_sync(THREE[:1], [dataclasses.replace(own[0], max_tokens=4)])
        assert longer.outcome == "ok" and longer.completion_tokens == 4
    with ExpertPool(PoolConfig(endpoints=[str(tiny_model_dir)], num_experts=3)) as pool:
        alone = [pool.ask_each_sync([c], [p])[0] for c, p in zip(THREE, own, strict=True)]
    assert [r.text for r in together] == [r.text for r in alone]
    assert [len(call[0]) for call in recorder.calls[1:]] == [1, 1, 1, 1]


def test_closed_pool_refuses_work(tiny_model_dir: Path) -> None:
    pool = ExpertPool(PoolConfig(endpoints=[str(tiny_model_dir)]))
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pool.ask_sync(THREE, SHORT)


def test_chat_template_kwargs_reach_every_endpoints_engine(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The options of the pool's engine config render the experts' chat prompts, and
    key the cache apart."""
    folder = str(thinking_model_dir(tiny_model_dir, tmp_path / "thinking"))
    config = PoolConfig(endpoints=[folder], cache_dir=str(tmp_path / "cache"))
    quiet = EngineConfig(chat_template_kwargs={"enable_thinking": False})
    with ExpertPool(config) as pool:
        [thinking] = pool.ask_sync([(1, CHAT)], SHORT)
    with ExpertPool(config, quiet) as pool:
        [first] = pool.ask_sync([(1, CHAT)], SHORT)
        [again] = pool.ask_sync([(1, CHAT)], SHORT)
    assert thinking.outcome == first.outcome == "ok"  # not the other options' cached answer
    assert first.prompt_tokens > thinking.prompt_tokens  # the empty think block
    assert again.outcome == "cached" and again.text == first.text


def test_a_pools_chat_template_options_are_its_engine_configs_alone() -> None:
    """One entry for them: the engine config every endpoint's engine is built with (a
    protocol's collaborators get the protocol's there); the pool config has none."""
    assert "chat_template_kwargs" not in {f.name for f in dataclasses.fields(PoolConfig)}
    quiet = EngineConfig(chat_template_kwargs={"enable_thinking": False})
    with ExpertPool(PoolConfig(endpoints=[REFERENCE]), quiet) as pool:
        assert pool.engine_config.chat_template_kwargs == {"enable_thinking": False}


# --- the response cache ------------------------------------------------------------------------


def test_cache_hits_misses_and_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = PoolConfig(endpoints=[str(tiny_model_dir)], cache_dir=str(tmp_path / "cache"))
    seeded = SamplingParams(max_tokens=8, temperature=1.0, seed=7)
    with ExpertPool(config) as pool:
        first = pool.ask_sync(THREE, seeded)
        assert [r.outcome for r in first] == ["ok"] * 3 and pool.generate_calls == 1

        again = pool.ask_sync(THREE, seeded)
        assert [r.outcome for r in again] == ["cached"] * 3 and pool.generate_calls == 1
        assert [r.text for r in again] == [r.text for r in first]
        assert [r.completion_tokens for r in again] == [r.completion_tokens for r in first]
        assert all(r.latency_s == 0 and r.attempts == 0 and r.ok for r in again)

        other_seed = pool.ask_sync(THREE[:1], dataclasses.replace(seeded, seed=8))
        assert other_seed[0].outcome == "ok" and pool.generate_calls == 2

    files = sorted((tmp_path / "cache").glob("*/*.json"))
    assert len(files) == 4
    assert all(f.parent.name == f.stem[:2] and len(f.stem) == 64 for f in files)
    assert not list((tmp_path / "cache").glob("*/.*.tmp"))  # no temp files left behind


def test_unseeded_samples_are_never_cached(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = PoolConfig(endpoints=[str(tiny_model_dir)], cache_dir=str(tmp_path))
    sampled = SamplingParams(max_tokens=4, temperature=1.0)
    with ExpertPool(config) as pool:
        for _ in range(2):
            assert pool.ask_sync(THREE[:1], sampled)[0].outcome == "ok"
    assert not list(tmp_path.rglob("*.json"))


def test_damaged_cache_entry_is_a_miss(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    key = ResponseCache.key({"ref": "m", "served_model": None}, "p", SHORT)
    cache.put(key, {"text": "hi", "prompt_tokens": 1, "completion_tokens": 1})
    assert cache.get(key) == {"text": "hi", "prompt_tokens": 1, "completion_tokens": 1}
    cache.path(key).write_text("{not json")
    assert cache.get(key) is None
    assert ResponseCache.key({"ref": "m", "served_model": None}, "p", SHORT) == key  # stable


# --- real servers ------------------------------------------------------------------------------


@pytest.fixture
def servers(tiny_model_dir: Path):
    """Start `collab serve` subprocesses; every one is killed at teardown, whatever happened."""
    started: list[ServerProcess] = []

    def start(port: int | None = None, api_key: str | None = None) -> ServerProcess:
        proc = ServerProcess(tiny_model_dir, port=port, api_key=api_key)
        started.append(proc)
        return proc.wait_ready(timeout=120)

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path):
    with ServerProcess(tiny_model_dir) as proc:  # kills the server on exit
        yield proc


def test_remote_pool_answers_three_experts(server: ServerProcess) -> None:
    with ExpertPool(PoolConfig(endpoints=[server.url], num_experts=3)) as pool:
        records = pool.ask_sync(THREE, SHORT)
        assert pool.generate_calls == 3  # one request per call
    for r in records:
        assert r.outcome == "ok" and r.endpoint == server.url and r.attempts == 1
        assert isinstance(r.text, str) and r.prompt_tokens > 0
        assert 1 <= r.completion_tokens <= 8  # the server's usage count


def test_killed_server_mid_flight_then_restart(servers) -> None:
    server = servers()
    config = PoolConfig(
        endpoints=[server.url],
        num_experts=3,
        timeout=5.0,
        retries=1,
        backoff=0.2,
        served_model="expert",
    )
    calls = [(1 + i % 3, f"Question {i}: what is 2+2?") for i in range(6)]
    # Seconds of work on the server, whatever the machine's speed: EOS is banned, so every
    # reply runs to max_tokens and the calls are surely in flight when the server dies.
    long = SamplingParams(max_tokens=1500, banned=("<|im_end|>",))

    async def kill_mid_flight(pool: ExpertPool) -> tuple[list[CallRecord], float, float]:
        began = time.monotonic()
        task = asyncio.ensure_future(pool.ask(calls, long))
        await asyncio.sleep(1.5)
        assert not task.done(), "the calls finished before the server was killed"
        server.proc.kill()  # SIGKILL: no graceful shutdown, connections just drop
        killed = time.monotonic()
        records = await task  # must not raise
        return records, time.monotonic() - began, time.monotonic() - killed

    with ExpertPool(config) as pool:
        assert pool.ask_sync(THREE[:1], SHORT)[0].ok  # warm: engine built, connection open
        records, elapsed, after_kill = asyncio.run(kill_mid_flight(pool))
        assert elapsed <= config.timeout * (config.retries + 1) + config.backoff + 5.0
        assert after_kill < config.timeout  # the drop was noticed, not waited out
        for r in records:
            assert r.outcome == "unavailable" and not r.ok and r.text is None
            assert "cannot reach" in r.error and r.attempts == config.retries + 1

        server.proc.wait(timeout=30)
        servers(port=server.port)  # the same address comes back
        again = pool.ask_sync(THREE, SHORT)
        assert [r.outcome for r in again] == ["ok"] * 3


def test_wrong_api_key_is_unavailable_and_not_retried(servers, monkeypatch) -> None:
    for var in ("COLLABRL_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    server = servers(api_key="k1")
    config = PoolConfig(endpoints=[server.url], retries=2, backoff=0.2)
    with ExpertPool(config) as pool:
        records = pool.ask_sync(THREE, SHORT)
    assert all(r.outcome == "unavailable" and "API key" in r.error for r in records)
    assert all(r.attempts == 1 for r in records)  # a 401 does not heal by retrying
    with ExpertPool(dataclasses.replace(config, api_key="k1")) as pool:
        assert [r.outcome for r in pool.ask_sync(THREE, SHORT)] == ["ok"] * 3
