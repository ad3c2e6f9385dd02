"""What a request asks the model, checked before it is queued (`collabrl.serve.inputs`);
the same refusals over HTTP are in tests/serve/test_app.py."""

from __future__ import annotations

import pytest

from collabrl.serve.inputs import ModelLimits, prompts_of, sampling_params
from collabrl.serve.openai_api import APIError, CompletionRequest
from collabrl.serve.stops import StopLimits


def test_an_unset_max_tokens_is_what_the_context_leaves(smol_tokenizer) -> None:
    limits = ModelLimits.of(smol_tokenizer, context=100)
    assert limits.max_tokens(None, 1024, prompt_tokens=40) == 60  # as vLLM does
    assert limits.max_tokens(None, 16, prompt_tokens=40) == 16
    assert limits.max_tokens(60, 16, prompt_tokens=40) == 60
    with pytest.raises(APIError):
        limits.max_tokens(61, 16, prompt_tokens=40)
    assert ModelLimits.of(smol_tokenizer, context=None).max_tokens(None, 7, 10**6) == 7


def test_every_prompt_form_is_one_prompt_or_a_batch() -> None:
    assert prompts_of("2 + 3") == ["2 + 3"]
    assert prompts_of([1, 2, 3]) == [[1, 2, 3]]  # one prompt given as token ids
    assert prompts_of([[1, 2], [3]]) == [[1, 2], [3]]
    assert prompts_of(["a", "b"]) == ["a", "b"]
    for empty in ([], [[1], []]):
        with pytest.raises(APIError) as err:
            prompts_of(empty)
        assert (err.value.status, err.value.param) == (400, "prompt")


def test_a_requests_sampling_params_keep_to_the_stop_limits() -> None:
    request = CompletionRequest(model="m", prompt="x", stop=["a", "b", "c"], seed=7)
    params = sampling_params(request, 8, logprobs=False, stop_limits=StopLimits(count=3))
    assert (params.stop, params.seed, params.max_tokens) == (("a", "b", "c"), 7, 8)
    with pytest.raises(APIError) as err:
        sampling_params(request, 8, logprobs=False, stop_limits=StopLimits(count=2))
    assert (err.value.status, err.value.param) == (400, "stop")
