"""The prompt length of a training run: the problems whose prompt is too long are
dropped, and the colocated vLLM is sized to prompt + episode.

The papers' frameworks drop overlong problems before training (EasyR1 and verl:
`max_prompt_length` with `filter_overlong_prompts`); `max_prompt_tokens` does the same
when a run starts. The length is counted on the prompt the rollout hands the policy:
its protocol's template (the data's or `--prompt` for solo and relay, EAPO's
appendix-D training prompt, rSIM's step prompt) rendered with the policy's tokenizer
and chat-template options, as `Policy.prompt_ids` renders it
(`tests/train/test_prompt_parity.py` holds the two equal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines.base import encode_prompt
from collabrl.errors import UserError
from collabrl.train.grpo_args import sizes_vllm

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from collabrl.data.benchmarks import Benchmark
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.resolve import ResolvedRun


def rollout_template(run: ResolvedRun, bench_prompt: str) -> PromptTemplate:
    """The template the run's rollout renders every problem with."""
    own = run.own_template()
    if own is not None:
        return own
    name = run.prompt(bench_prompt)
    assert name is not None  # a protocol without its own prompt takes the data's
    return get_prompt(name)


def policy_tokenizer(config: GRPOTrainConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of the policy's prompt ids (the protocol's `tokenizer` where set,
    as `build_protocol` takes it)."""
    from collabrl.models import load_tokenizer

    return load_tokenizer(config.protocol.tokenizer or config.model)


def prompt_lengths(
    run: ResolvedRun, bench: Benchmark, tokenizer: PreTrainedTokenizerBase | None = None
) -> list[int]:
    """The prompt length in policy tokens of every problem of `bench`, in order."""
    template = rollout_template(run, bench.prompt)
    tokenizer = tokenizer or policy_tokenizer(run.config)
    options = run.config.engine.chat_template_kwargs
    messages = (template.messages(item.problem) for item in bench.items)
    return [len(encode_prompt(tokenizer, m, options)) for m in messages]


@dataclasses.dataclass(frozen=True)
class PromptFilter:
    """The problems a prompt limit keeps, and what it dropped."""

    bench: Benchmark
    dropped: int
    longest: int  # the longest prompt of the data, kept or not

    def line(self, limit: int) -> str:
        total = len(self.bench.items) + self.dropped
        return (
            f"max_prompt_tokens {limit}: {len(self.bench.items)} of {total} problems kept, "
            f"{self.dropped} dropped (the longest prompt is {self.longest} tokens)"
        )


def fit_prompts(
    run: ResolvedRun, bench: Benchmark, tokenizer: PreTrainedTokenizerBase | None = None
) -> PromptFilter:
    """The problems of `bench` whose prompt fits `max_prompt_tokens`; refused when none
    does (a run would have nothing to train on)."""
    config = run.config
    limit = config.max_prompt_tokens
    assert limit is not None
    lengths = prompt_lengths(run, bench, tokenizer)
    kept = [item for item, n in zip(bench.items, lengths, strict=True) if n <= limit]
    if not kept:
        raise UserError(
            f"no problem of {config.data} fits max_prompt_tokens {limit} "
            f"(the shortest prompt is {min(lengths)} tokens)",
            "raise max_prompt_tokens",
        )
    fitted = dataclasses.replace(bench, items=kept)
    return PromptFilter(fitted, len(bench.items) - len(kept), max(lengths))


def training_problems(
    run: ResolvedRun, bench: Benchmark, report: Callable[[str], None] | None = None
) -> Benchmark:
    """The problems the run trains on: all of `bench`, or those whose prompt fits
    `max_prompt_tokens` (`report` gets the count)."""
    limit = run.config.max_prompt_tokens
    if limit is None:
        return bench
    fitted = fit_prompts(run, bench)
    if report is not None:
        report(fitted.line(limit))
    return fitted.bench


def longest_prompt(run: ResolvedRun, bench: Benchmark) -> int | None:
    """The longest prompt of `bench` where it sizes the colocated vLLM: no
    max_prompt_tokens, and a length TRL would otherwise take from the model (131,072
    tokens for R1-Distill-7B: a KV cache at 30 % of a GPU then holds about one
    sequence); None elsewhere (nothing is rendered)."""
    if run.config.max_prompt_tokens is not None or not sizes_vllm(run.config.trl):
        return None
    return max(prompt_lengths(run, bench))
