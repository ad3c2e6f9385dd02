"""Tests for the transformers engine, run for real on a tiny random Llama."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from collabrl.config import EngineConfig
from collabrl.engines import create_engine
from collabrl.engines.base import Completion, Engine, SamplingParams, cut_at_stop
from collabrl.engines.hf import TransformersEngine
from collabrl.errors import UserError
from tests.engines.templates import EMPTY_THINK, thinking_model_dir, thinking_tokenizer

SHORT = "What is 2+2?"
MEDIUM = "Hello there, how are you today?"
LONG = (
    "A much longer prompt with many more tokens in it than the others here, and it goes "
    "on and on for a while so that the short prompts get plenty of left padding."
)
GREEDY = SamplingParams(max_tokens=12)


def _greedy(engine: TransformersEngine, prompt, max_tokens: int = 12) -> Completion:
    return engine.generate([prompt], SamplingParams(max_tokens=max_tokens))[0][0]


def _clean_token_index(engine: TransformersEngine, completion: Completion, start: int) -> int:
    """Index >= start of a generated token that decodes to a plain word not seen before it."""
    tok = engine.tokenizer
    for i in range(start, len(completion.token_ids)):
        piece = tok.decode([completion.token_ids[i]])
        before = tok.decode(completion.token_ids[:i])
        word = piece.strip()
        if len(word) >= 3 and word.isalpha() and word not in before:
            return i
    pytest.fail(f"no clean word token in {completion.text!r}")


# --- the engine interface ------------------------------------------------------------------------


def test_engine_satisfies_the_protocol(tiny_engine: TransformersEngine, tiny_model_dir) -> None:
    assert isinstance(tiny_engine, Engine)
    assert tiny_engine.name == str(tiny_model_dir)


def test_create_engine_builds_a_transformers_engine(tiny_model_dir: Path) -> None:
    engine = create_engine(str(tiny_model_dir), EngineConfig(batch_size=3))
    assert isinstance(engine, TransformersEngine)
    assert engine.batch_size == 3
    engine.close()
    assert engine.model is None


@pytest.mark.parametrize(
    ("model", "config", "message"),
    [
        ("m", EngineConfig(kind="tensorrt"), "unknown engine 'tensorrt'"),
        ("local-folder", EngineConfig(kind="openai"), "needs a base URL"),
        ("http://127.0.0.1:1/v1", EngineConfig(kind="transformers"), "runs a local model"),
    ],
)
def test_create_engine_rejects_bad_combinations(model, config, message) -> None:
    with pytest.raises(UserError, match=message):
        create_engine(model, config)


def test_batch_size_must_be_positive(tiny_engine: TransformersEngine) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        TransformersEngine(tiny_engine.model, tiny_engine.tokenizer, batch_size=0)


# --- prompts -------------------------------------------------------------------------------------


def test_a_final_assistant_message_is_continued_not_closed(tiny_engine: TransformersEngine) -> None:
    tok = tiny_engine.tokenizer
    messages = [{"role": "user", "content": SHORT}, {"role": "assistant", "content": "Step 1:"}]
    rendered = tok.decode(tiny_engine.encode(messages))
    assert rendered.endswith("<|im_start|>assistant\nStep 1:")


def test_chat_messages_use_the_chat_template(tiny_engine: TransformersEngine) -> None:
    tok = tiny_engine.tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": SHORT}]
    ids = tiny_engine.encode(messages)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(start) == 3  # system, user and the generation prompt
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.rstrip().endswith("<|im_start|>assistant")
    # Text prompts are taken as already formatted: the rendered chat encodes the same.
    assert tiny_engine.encode(rendered) == ids


def test_text_prompts_get_no_special_tokens_added(tiny_engine: TransformersEngine) -> None:
    ids = tiny_engine.encode(SHORT)
    assert ids == tiny_engine.tokenizer(SHORT, add_special_tokens=False)["input_ids"]
    assert tiny_engine.tokenizer.bos_token_id not in ids


def test_token_id_prompts_pass_through(tiny_engine: TransformersEngine) -> None:
    ids = tiny_engine.encode(MEDIUM)
    assert tiny_engine.encode(list(ids)) == ids
    by_ids = tiny_engine.generate([ids], GREEDY)[0][0]
    by_text = tiny_engine.generate([MEDIUM], GREEDY)[0][0]
    assert by_ids.token_ids == by_text.token_ids


# --- batching, order and determinism -------------------------------------------------------------


def test_results_come_back_in_prompt_order_with_n_each(tiny_engine: TransformersEngine) -> None:
    prompts = [SHORT, LONG, [{"role": "user", "content": MEDIUM}], MEDIUM]
    params = SamplingParams(max_tokens=4, temperature=1.0, n=3, seed=7)
    results = tiny_engine.generate(prompts, params)  # 12 rows in batches of 4, sorted by length
    assert len(results) == len(prompts)
    for prompt, completions in zip(prompts, results, strict=True):
        assert len(completions) == 3
        for c in completions:
            assert c.prompt_tokens == len(tiny_engine.encode(prompt))
            assert 1 <= len(c.token_ids) <= 4


def test_greedy_batch_matches_each_prompt_alone(tiny_engine: TransformersEngine) -> None:
    prompts = [SHORT, LONG, MEDIUM, [{"role": "user", "content": SHORT}], "Hi"]
    batched = tiny_engine.generate(prompts, GREEDY)
    for prompt, (completion,) in zip(prompts, batched, strict=True):
        alone = _greedy(tiny_engine, prompt)
        assert completion.token_ids == alone.token_ids, prompt
        assert completion.text == alone.text


def test_left_padding_does_not_change_greedy_tokens(tiny_engine: TransformersEngine) -> None:
    """SHORT shares a batch with LONG (lots of left padding) and with itself (none)."""
    wide = TransformersEngine(tiny_engine.model, tiny_engine.tokenizer, batch_size=8)
    padded = wide.generate([LONG, SHORT], GREEDY)[1][0]
    alone = _greedy(tiny_engine, SHORT)
    assert padded.token_ids == alone.token_ids
    # The check has teeth: padding the prompt *without* masking it changes the output.
    ids = tiny_engine.encode(SHORT)
    pad = [tiny_engine.tokenizer.pad_token_id] * 30
    with torch.inference_mode():
        unmasked = tiny_engine.model.generate(
            input_ids=torch.tensor([pad + ids]),
            attention_mask=torch.ones(1, len(pad) + len(ids), dtype=torch.long),
            max_new_tokens=GREEDY.max_tokens,
            do_sample=False,
            pad_token_id=tiny_engine.tokenizer.pad_token_id,
        )
    assert unmasked[0, len(pad) + len(ids) :].tolist() != alone.token_ids


def test_greedy_is_deterministic_and_n_copies_agree(tiny_engine: TransformersEngine) -> None:
    first = tiny_engine.generate([MEDIUM], SamplingParams(max_tokens=10, n=3))[0]
    second = tiny_engine.generate([MEDIUM], SamplingParams(max_tokens=10, n=3))[0]
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert len({tuple(c.token_ids) for c in first}) == 1


def test_sampling_with_a_seed_repeats_and_other_seeds_differ(
    tiny_engine: TransformersEngine,
) -> None:
    def sample(seed: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=10, temperature=1.0, n=4, seed=seed)
        return [c.token_ids for group in tiny_engine.generate([SHORT, LONG], params) for c in group]

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)
    # Samples of one prompt are not all copies of each other.
    assert len({tuple(ids) for ids in sample(3)[:4]}) > 1


def test_top_k_one_is_greedy(tiny_engine: TransformersEngine) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.5, top_k=1, seed=0)
    sampled = tiny_engine.generate([MEDIUM], params)[0][0]
    assert sampled.token_ids == _greedy(tiny_engine, MEDIUM, 10).token_ids


# --- length, EOS, stop strings, banned strings ---------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 3, 9])
def test_max_tokens_is_respected(tiny_engine: TransformersEngine, max_tokens: int) -> None:
    for (c,) in tiny_engine.generate([SHORT, LONG], SamplingParams(max_tokens=max_tokens)):
        assert len(c.token_ids) <= max_tokens
        if c.finish_reason == "length":
            assert len(c.token_ids) == max_tokens
        assert c.text == tiny_engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_eos_ends_a_row_and_padding_is_trimmed(tiny_model_dir: Path) -> None:
    """Make a token the model produces greedily its EOS; rows stop right after it."""
    from collabrl.models import load_model, load_tokenizer

    model, tok = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    reference = TransformersEngine(model, tok)
    full = _greedy(reference, SHORT)
    k = 3
    stop_id = full.token_ids[k]
    assert stop_id not in full.token_ids[:k]

    model.generation_config.eos_token_id = [stop_id]
    engine = TransformersEngine(model, tok, batch_size=4)
    short, long_ = engine.generate([SHORT, LONG], GREEDY)
    assert short[0].token_ids == full.token_ids[: k + 1]
    assert short[0].finish_reason == "stop"
    assert short[0].stop_reason is None
    # The longer row kept generating; it was not cut by the other row's end.
    assert long_[0].token_ids == _greedy(reference, LONG).token_ids[: len(long_[0].token_ids)]


def test_stop_string_cuts_the_text(tiny_engine: TransformersEngine) -> None:
    full = _greedy(tiny_engine, SHORT)
    k = _clean_token_index(tiny_engine, full, start=2)
    stop = tiny_engine.tokenizer.decode([full.token_ids[k]]).strip()
    expected = full.text[: full.text.index(stop)]

    (c,) = tiny_engine.generate([SHORT], SamplingParams(max_tokens=12, stop=(stop,)))[0]
    assert c.text == expected
    assert stop not in c.text
    assert c.finish_reason == "stop"
    assert c.stop_reason == stop
    assert c.token_ids == full.token_ids[: k + 1]  # up to the token that completed the stop


def test_include_stop_keeps_it_and_trims_tokens(tiny_engine: TransformersEngine) -> None:
    full = _greedy(tiny_engine, SHORT)
    k = _clean_token_index(tiny_engine, full, start=2)
    stop = tiny_engine.tokenizer.decode([full.token_ids[k]]).strip()

    params = SamplingParams(max_tokens=12, stop=(stop, "never-produced-zzz"), include_stop=True)
    # In a batch with a longer prompt, so the finished row is followed by padding.
    (c,), _ = tiny_engine.generate([SHORT, LONG], params)
    assert c.text == full.text[: full.text.index(stop) + len(stop)]
    assert c.text.endswith(stop)
    assert c.stop_reason == stop
    decoded = tiny_engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert stop in decoded
    assert stop not in tiny_engine.tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)


def test_stop_string_that_never_appears_changes_nothing(tiny_engine: TransformersEngine) -> None:
    full = _greedy(tiny_engine, MEDIUM)
    (c,) = tiny_engine.generate([MEDIUM], SamplingParams(max_tokens=12, stop=("@@@@",)))[0]
    assert c.token_ids == full.token_ids
    assert c.stop_reason is None
    assert c.finish_reason == "length"


def test_banned_strings_never_appear(tiny_engine: TransformersEngine) -> None:
    full = _greedy(tiny_engine, LONG, max_tokens=16)
    k = _clean_token_index(tiny_engine, full, start=0)
    word = tiny_engine.tokenizer.decode([full.token_ids[k]]).strip()
    assert word in full.text

    params = SamplingParams(max_tokens=16, banned=(word,))
    (c,) = tiny_engine.generate([LONG], params)[0]
    assert word not in c.text
    assert c.token_ids[:k] == full.token_ids[:k]  # identical until the banned token
    assert c.token_ids[k] != full.token_ids[k]

    sampled = tiny_engine.generate(
        [LONG], SamplingParams(max_tokens=16, temperature=1.0, n=4, seed=1, banned=(word,))
    )[0]
    assert all(word not in s.text for s in sampled)


# --- logprobs ------------------------------------------------------------------------------------


def test_logprobs_align_with_tokens_and_are_log_probabilities(
    tiny_engine: TransformersEngine,
) -> None:
    for params in (
        SamplingParams(max_tokens=8, logprobs=True),
        SamplingParams(max_tokens=8, logprobs=True, temperature=0.8, n=2, seed=5),
    ):
        for group in tiny_engine.generate([SHORT, LONG], params):
            for c in group:
                assert c.logprobs is not None
                assert len(c.logprobs) == len(c.token_ids)
                assert all(lp <= 0.0 for lp in c.logprobs)


def test_greedy_logprobs_match_a_forward_pass(tiny_engine: TransformersEngine) -> None:
    (c,), _ = tiny_engine.generate([SHORT, LONG], SamplingParams(max_tokens=6, logprobs=True))
    prompt = tiny_engine.encode(SHORT)
    ids = torch.tensor([prompt + c.token_ids])
    with torch.inference_mode():
        logits = tiny_engine.model(ids).logits[0].float()
    steps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    expected = steps.gather(-1, torch.tensor(c.token_ids).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)
    # Greedy picks the most likely token, so each logprob is the step's maximum.
    assert torch.allclose(expected, steps.max(dim=-1).values, atol=1e-6)


def test_no_logprobs_unless_asked(tiny_engine: TransformersEngine) -> None:
    assert _greedy(tiny_engine, SHORT, 3).logprobs is None


# --- SamplingParams and cut_at_stop --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n must be"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_sampling_params_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_greedy_flag() -> None:
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.5).greedy


@pytest.mark.parametrize(
    ("text", "stops", "include", "expected"),
    [
        ("abc STOP def END", ("END", "STOP"), False, ("abc ", "STOP")),
        ("abc STOP def END", ("END", "STOP"), True, ("abc STOP", "STOP")),
        ("no stop here", ("END",), False, ("no stop here", None)),
        ("END at start", ("END",), False, ("", "END")),
        ("xx", (), False, ("xx", None)),
    ],
)
def test_cut_at_stop(text, stops, include, expected) -> None:
    assert cut_at_stop(text, stops, include) == expected


def test_prefix_cache_resumes_a_sequence_without_changing_it(tiny_model_dir) -> None:
    """A prompt that extends an earlier sequence reuses its KV cache."""
    cached = TransformersEngine.from_ref(str(tiny_model_dir), prefix_cache=True)
    plain = TransformersEngine.from_ref(str(tiny_model_dir))
    start = cached.encode([{"role": "user", "content": SHORT}])
    insert = cached.tokenizer("<call>5</call> and", add_special_tokens=False)["input_ids"]
    histories = []
    for engine in (cached, plain):
        ids = list(start)
        for _ in range(3):
            [[c]] = engine.generate([ids], SamplingParams(max_tokens=6))
            ids = ids + c.token_ids + insert
        histories.append(ids)
    assert histories[0] == histories[1]
    assert cached.cached_tokens > 2 * len(start) and plain.cached_tokens == 0
    # Every row of a batch reuses: both rows here are prefixes of the stored sequences
    # (all of a prompt but its last token is served; that one starts the row).
    before = cached.cached_tokens
    assert cached.generate([start, start], SamplingParams(max_tokens=2)) == plain.generate(
        [start, start], SamplingParams(max_tokens=2)
    )
    assert cached.cached_tokens == before + 2 * (len(start) - 1)


# --- chat-template options -----------------------------------------------------------------------


def test_chat_template_kwargs_reach_the_template(tiny_engine: TransformersEngine) -> None:
    """A template that reads `enable_thinking` (as Qwen3's does) renders what was asked."""
    tok = thinking_tokenizer(tiny_engine.tokenizer)
    messages = [{"role": "user", "content": SHORT}]
    thinking = TransformersEngine(tiny_engine.model, tok)
    quiet = TransformersEngine(
        tiny_engine.model, tok, chat_template_kwargs={"enable_thinking": False}
    )
    assert tok.decode(quiet.encode(messages)).endswith("<|im_start|>assistant\n" + EMPTY_THINK)
    assert tok.decode(thinking.encode(messages)).endswith("<|im_start|>assistant\n")
    [[c]] = quiet.generate([messages], SamplingParams(max_tokens=2))
    assert c.prompt_tokens == len(quiet.encode(messages)) > len(thinking.encode(messages))


def test_create_engine_passes_the_chat_template_kwargs(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = thinking_model_dir(tiny_model_dir, tmp_path / "thinking")
    config = EngineConfig(chat_template_kwargs={"enable_thinking": False})
    engine = create_engine(str(folder), config)
    rendered = engine.tokenizer.decode(engine.encode([{"role": "user", "content": SHORT}]))
    assert rendered.endswith(EMPTY_THINK)


# --- state under training ------------------------------------------------------------------------


def test_a_seeded_generate_leaves_the_callers_random_stream_alone(
    tiny_engine: TransformersEngine,
) -> None:
    """A trainer's own draws go on as if the seeded rollout had not happened."""
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=7)
    torch.manual_seed(1234)
    expected = torch.rand(5)
    torch.manual_seed(1234)
    first = tiny_engine.generate([SHORT, LONG], params)
    assert torch.equal(torch.rand(5), expected)
    # ... and seeded runs still repeat, whatever the global state.
    torch.manual_seed(99)
    again = tiny_engine.generate([SHORT, LONG], params)
    assert [c.token_ids for g in first for c in g] == [c.token_ids for g in again for c in g]


def _fresh_engine(tiny_model_dir: Path, prefix_cache: bool) -> TransformersEngine:
    """An engine over its own copy of the tiny model, whose weights a test may change."""
    from collabrl.models import load_model, load_tokenizer

    model = load_model(str(tiny_model_dir))
    return TransformersEngine(model, load_tokenizer(str(tiny_model_dir)), prefix_cache=prefix_cache)


def _resume(engine: TransformersEngine, start: list[int]) -> list[int]:
    """The first turn's sequence plus an inserted tool result: the next turn's prompt."""
    [[c]] = engine.generate([start], SamplingParams(max_tokens=6))
    return (
        start
        + c.token_ids
        + engine.tokenizer(" <call>5</call>", add_special_tokens=False)["input_ids"]
    )


def test_prefix_cache_is_not_served_after_an_optimizer_step(tiny_model_dir: Path) -> None:
    engine = _fresh_engine(tiny_model_dir, prefix_cache=True)
    start = engine.encode([{"role": "user", "content": SHORT}])
    prompt = _resume(engine, start)
    # One SGD step changes every weight in place, as training between rollouts does.
    model = engine.model
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    ids = torch.tensor([prompt])
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()

    [[after]] = engine.generate([prompt], SamplingParams(max_tokens=6))
    fresh = TransformersEngine(model, engine.tokenizer)  # no cache: the new weights' answer
    [[expected]] = fresh.generate([prompt], SamplingParams(max_tokens=6))
    assert after.token_ids == expected.token_ids
    assert engine.cached_tokens == 0  # the stale cache was dropped, not cropped and reused
    # With unchanged weights the cache is reused again.
    engine.generate([prompt + after.token_ids], SamplingParams(max_tokens=2))
    assert engine.cached_tokens > len(prompt)


def test_reset_drops_the_prefix_cache(tiny_model_dir: Path) -> None:
    """Writes through `param.data` bypass the version counters: `reset()` is the way."""
    engine = _fresh_engine(tiny_model_dir, prefix_cache=True)
    prompt = _resume(engine, engine.encode([{"role": "user", "content": SHORT}]))
    with torch.no_grad():
        for p in engine.model.parameters():
            p.data.mul_(1.5)
    engine.reset()
    [[after]] = engine.generate([prompt], SamplingParams(max_tokens=6))
    [[expected]] = TransformersEngine(engine.model, engine.tokenizer).generate(
        [prompt], SamplingParams(max_tokens=6)
    )
    assert after.token_ids == expected.token_ids and engine.cached_tokens == 0


def test_an_interruptible_generate_stops_when_told(tiny_engine: TransformersEngine) -> None:
    event = threading.Event()
    timer = threading.Timer(0.5, event.set)  # another thread: a server shutting down
    began = time.monotonic()
    timer.start()
    with tiny_engine.interruptible(event):
        [[c]] = tiny_engine.generate([SHORT], SamplingParams(max_tokens=2000))
    assert time.monotonic() - began < 5  # 2000 tokens take about 10 s here
    assert 1 <= len(c.token_ids) < 2000 and c.finish_reason == "length"
    # Outside the block the event has no say.
    [[full]] = tiny_engine.generate([SHORT], SamplingParams(max_tokens=12))
    assert len(full.token_ids) == 12


def test_context_length_ignores_the_tokenizers_unknown_sentinel(
    tiny_engine: TransformersEngine,
) -> None:
    assert tiny_engine.tokenizer.model_max_length > 10**20  # transformers' "unknown"
    assert tiny_engine.context_length == 2048  # the model's max_position_embeddings


def _prompt_of(engine: TransformersEngine, tokens: int) -> str:
    """A raw-text prompt that encodes to exactly `tokens` tokens."""
    text = " one" * tokens
    while len(engine.encode(text)) > tokens:
        text = text[: -len(" one")]
    assert len(engine.encode(text)) == tokens
    return text


def test_a_prompt_past_the_context_is_refused_in_one_line(tiny_engine: TransformersEngine) -> None:
    long = _prompt_of(tiny_engine, tiny_engine.context_length)
    with pytest.raises(UserError, match="does not fit the model's context of 2048 tokens"):
        tiny_engine.generate([SHORT, long], SamplingParams(max_tokens=4))


def test_a_budget_past_the_context_is_cut_to_what_is_left(tiny_engine: TransformersEngine) -> None:
    near = _prompt_of(tiny_engine, tiny_engine.context_length - 3)
    params = SamplingParams(max_tokens=40, temperature=0.0)
    [[cut], [whole]] = tiny_engine.generate([near, SHORT], params)
    assert len(cut.token_ids) == 3 and cut.finish_reason == "length"
    assert len(whole.token_ids) == 40  # the other prompt of the batch keeps its budget
