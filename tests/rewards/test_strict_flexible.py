"""Strict and flexible grading (issue 33): a response cut by the token budget inside a
numbered list ends in a list number, which GSM8K's last-number fallback reads as its
answer. Evaluation reports lm-eval's two numbers apart; training never pays for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl import runs
from collabrl.data.benchmarks import Benchmark, load_benchmark
from collabrl.data.prompts import get_prompt
from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.eval.runner import sample_record
from collabrl.protocols.rounds import finish
from collabrl.protocols.sampling import Unit
from collabrl.train.rollout import episode_extras
from tests.eval.test_runner import disk_metrics

GSM8K = load_benchmark("gsm8k", limit=1)
ITEM = GSM8K.items[0]
# What solo reads a GSM8K answer with: the relay prompt's \boxed{} and Answer: line, then
# the benchmark's last-number fallback.
EXTRACTORS = get_prompt(GSM8K.prompt).extractors(GSM8K.extract_fallback)
# Cut at the token limit in the middle of a list whose current item is the gold number.
TRUNCATED = f"1. First, count the bolts.\n2. 1 bolt of white fiber per robe.\n{ITEM.answer}"


def _episode(text: str, end: EndReason) -> Episode:
    """A solo episode the policy wrote `text` in, closed as the protocols close one."""
    episode = Episode(ITEM.id, [1, 2], meta={"protocol": "solo"})
    episode.add(Segment(Author.POLICY, text, [3]))
    episode.end = end
    finish(episode, lambda _: text, EXTRACTORS)
    return episode


@pytest.mark.parametrize(
    ("text", "end", "credited"),
    [
        pytest.param(TRUNCATED, EndReason.LENGTH, False, id="truncated list number"),
        pytest.param(TRUNCATED, EndReason.EOS, True, id="a finished text's last number"),
        pytest.param(f"So \\boxed{{{ITEM.answer}}}. 2. Then", EndReason.LENGTH, True, id="boxed"),
    ],
)
def test_a_truncated_samples_last_number_earns_no_training_reward(
    text: str, end: EndReason, credited: bool
) -> None:
    extras = episode_extras(_episode(text, end), ITEM)
    assert extras["answer"] == ITEM.answer  # what was read is still recorded
    assert extras["correct"] is credited
    assert extras["f1"] == (1.0 if credited else 0.0)


def test_strict_grading_takes_only_the_format_the_prompt_asks_for() -> None:
    boxed = episode_extras(_episode(f"\\boxed{{{ITEM.answer}}}", EndReason.EOS), ITEM)
    bare = episode_extras(_episode(TRUNCATED, EndReason.EOS), ITEM)
    assert (boxed["strict_correct"], bare["strict_correct"]) == (True, False)


def test_eval_reports_strict_match_and_flexible_extract_apart(tmp_path: Path) -> None:
    """The case of the issue: sample 0 is cut in its list, sample 1 boxes the answer.
    Flexible credits both, as lm-eval's flexible-extract does; strict only the box."""
    episodes = [
        _episode(TRUNCATED, EndReason.LENGTH),
        _episode(f"\\boxed{{{ITEM.answer}}}", EndReason.EOS),
    ]
    records = [sample_record(Unit(ITEM, i), e, 0.1) for i, e in enumerate(episodes)]
    (tmp_path / runs.SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in records))

    metrics = disk_metrics(tmp_path, Benchmark("gsm8k", [ITEM]), n=2)

    assert [r["finish_reason"] for r in records] == ["length", "stop"]
    assert metrics["flexible-extract"] == metrics["avg@2"] == 1.0
    assert metrics["strict-match"] == 0.5


def test_samples_written_before_strict_grading_still_score(tmp_path: Path) -> None:
    episode = _episode(f"\\boxed{{{ITEM.answer}}}", EndReason.EOS)
    old = sample_record(Unit(ITEM, 0), episode, 0.1)
    del old["strict_correct"]
    (tmp_path / runs.SAMPLES).write_text(json.dumps(old) + "\n")
    metrics = disk_metrics(tmp_path, Benchmark("gsm8k", [ITEM]), n=1)
    assert metrics["avg@1"] == 1.0 and "strict-match" not in metrics
