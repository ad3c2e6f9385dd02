"""The turn-taking loop every protocol runs, and how an episode ends.

Generate, pause, serve, resume: `run_rounds` drives a batch of episodes; `fail` and
`guard` keep one episode's error from costing the batch; `finish` reads the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from collabrl.data.prompts import PromptTemplate
from collabrl.engines.base import SamplingParams
from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.protocols.base import Policy, Task, policy_turn, remaining
from collabrl.rewards.extract import extract_answer_by
from collabrl.rewards.score import EXTRACTOR_KEY
from collabrl.tools.base import describe, printable

log = logging.getLogger(__name__)

Pause = TypeVar("Pause")
Result = TypeVar("Result")

# Characters of an error kept in an episode's meta and its log line.
ERROR_CHARS = 500


def describe_error(error: BaseException) -> str:
    """An exception on one line, cut to ERROR_CHARS: escaped, since its message may carry
    what the policy wrote (control bytes, a lone surrogate) into logs and transcripts."""
    return printable(describe(error)).replace("\n", "\\n")[:ERROR_CHARS]


def fail(episode: Episode, error: BaseException) -> None:
    """End an episode at ERROR with the error in its meta, and say so once.

    The policy writes whatever it likes, and a tool, a collaborator or a parser that
    raises on it must cost that episode, never the batch, the step or the run."""
    episode.end = EndReason.ERROR
    episode.meta["error"] = describe_error(error)
    log.warning(
        "episode %s (sample %s) failed, the rest of its batch goes on: %s",
        episode.problem_id,
        episode.meta.get("sample", 0),
        episode.meta["error"],
    )


def guard(episode: Episode, work: Callable[..., Result], *args: Any) -> Result | None:
    """`work(*args)`, done for `episode`: when it raises, the episode fails (`fail`) and
    None comes back, so that the caller goes on with the other episodes. Only
    `Exception`s: an interrupt still stops the run."""
    try:
        return work(*args)
    except Exception as error:  # whatever the policy's text set off
        fail(episode, error)
        return None


def segment_end(segment: Segment) -> EndReason:
    """How a policy segment that asked for nothing ended: at its EOS, or out of tokens."""
    return EndReason.EOS if segment.meta.get("finish_reason") == "stop" else EndReason.LENGTH


def run_rounds(
    policy: Policy,
    episodes: list[Episode],
    params: SamplingParams,
    stop: tuple[str, ...],
    after_policy: Callable[[int, Segment], Pause | None],
    serve: Callable[[list[tuple[int, Pause]], int], list[int]],
    banned: tuple[str, ...] = (),
) -> None:
    """The loop of every turn-taking protocol: generate → pause → serve → resume.

    Each round, the running episodes continue in one batched policy call that stops at
    `stop` (kept in the text). `after_policy(i, segment)` sees episode i's new segment,
    already appended, and returns its pause (what the stop asks for), or None when the
    episode is over, having set `episode.end`. `serve(pauses, round_no)` answers all the
    round's pauses together (teacher calls, expert queries, tool runs) and returns the
    episodes that go on; one left without token budget ends at LENGTH.

    One episode whose segment cannot be read, or whose pause cannot be served, fails
    (`fail`: EndReason.ERROR) and the others go on: `after_policy` runs guarded, and
    `serve` guards its per-episode work (`guard`); a `serve` that raises all the same
    fails the episodes of that round's pauses, not the batch.
    """
    active = list(range(len(episodes)))
    round_no = 0
    while active:
        running = [episodes[i] for i in active]
        segments = policy_turn(
            policy, running, params, round_no, stop=stop, include_stop=True, banned=banned
        )
        pauses: list[tuple[int, Pause]] = []
        for i, segment in zip(active, segments, strict=True):
            episodes[i].add(segment)
            pause = guard(episodes[i], after_policy, i, segment)
            if pause is not None:
                pauses.append((i, pause))
        try:
            going = serve(pauses, round_no)
        except Exception as error:  # the round's shared work (one batched call) raised
            for i, _ in pauses:
                fail(episodes[i], error)
            going = []
        active = []
        for i in going:
            if episodes[i].end is not None:  # failed while it was served
                continue
            if remaining(episodes[i], params) > 0:
                active.append(i)
            else:
                episodes[i].end = EndReason.LENGTH
        round_no += 1


def finish(
    episode: Episode, answer_text: Callable[[Episode], str], extractors: tuple[str, ...]
) -> None:
    """Close an episode: its answer, read from `answer_text(episode)` (the text its
    protocol reads answers in), and EMPTY when the policy wrote nothing at all.

    An episode with no policy token has nothing to train on (an all-zero loss mask);
    its end reason says so, whatever stopped it, and trainers mask it and count it. A
    failed episode (ERROR, here too when its text cannot be read) keeps no answer, so
    that no reward can credit one, and stays ERROR: the error is what stopped it.
    """
    if episode.end is None:
        raise RuntimeError(f"protocol bug: episode {episode.problem_id} ended without a reason")
    text = guard(episode, answer_text, episode) if episode.end is not EndReason.ERROR else None
    if text is None:
        return
    # The extractors never raise on text (rewards.extract), only on an unknown name.
    episode.answer, extractor = extract_answer_by(text, extractors)
    if extractor is not None:  # strict or flexible, as rewards.score grades it
        episode.meta[EXTRACTOR_KEY] = extractor
    wrote = any(s.token_ids or s.text for s in episode.segments if s.author is Author.POLICY)
    if not wrote:
        episode.meta["end_before_empty"] = str(episode.end)
        episode.end = EndReason.EMPTY


def new_episodes(
    policy: Policy, template: PromptTemplate, tasks: list[Task], protocol: str
) -> list[Episode]:
    """An empty episode per task: the template's prompt in policy ids (messages kept)."""
    episodes = []
    for task in tasks:
        messages = template.messages(task.question)
        meta = {
            "protocol": protocol,
            "sample": task.sample,
            "question": task.question,
            "prompt": messages,  # text-only policies are sent these; records show them
        }
        episodes.append(Episode(task.problem_id, policy.prompt_ids(messages), meta=meta))
    return episodes
