"""What every protocol shares: tasks, the policy, and the Protocol interface.

A protocol is the rule of one method — who writes next — driven over a *batch* of
episodes at once: every round, all episodes still running ask the policy to continue
in one batched `generate` (token-id prompts: exactly the ids recorded in the
Episode), then the protocol hands the pauses to teachers, experts or a planner. The
same object serves `collab infer`, `collab eval` and the trainers.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from collabrl.config import EngineConfig
from collabrl.data.prompts import PromptTemplate
from collabrl.engines import create_engine
from collabrl.engines.base import (
    ChatMessage,
    Completion,
    Engine,
    Prompt,
    SamplingParams,
    encode_prompt,
)
from collabrl.engines.reference import Reference
from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.errors import UserError
from collabrl.rewards.extract import extract_answer_by
from collabrl.rewards.score import EXTRACTOR_KEY
from collabrl.tools.base import describe, printable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

Pause = TypeVar("Pause")
Result = TypeVar("Result")

# Characters of an error kept in an episode's meta and its log line.
ERROR_CHARS = 500


@dataclass(frozen=True)
class Task:
    """One problem to solve, and which of its samples this episode is."""

    problem_id: str
    question: str
    sample: int = 0
    # The gold answer (and solution): only the `reference` stand-in collaborator reads it.
    reference: Reference | None = None


class CollabProtocol(Protocol):
    """The interface of every protocol (solo, relay, consult, strategy, apollo, and any
    registered one)."""

    name: str

    def run(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        """One finished Episode per task, in order.

        `params.max_tokens` bounds each episode's whole response (every author's
        tokens); `params.seed`, when set, makes the run reproducible.
        """
        ...

    def close(self) -> None:
        """Release the engines the protocol created."""
        ...


class Policy:
    """The model being evaluated or trained: an engine and the tokenizer of its ids.

    The Episode records the ids the policy sampled: local engines (transformers, vLLM)
    return them, and so do vLLM's and `collab serve`'s HTTP servers, asked by the
    token-id prompts the protocols send. An endpoint that returns text only has the
    text encoded with the policy tokenizer (`--tokenizer`) instead: close, but not what
    was sampled (an EOS is lost), so such segments are marked `meta["reencoded"]` and
    trainers refuse them. Without a tokenizer only `solo` can run (chat prompts, text
    only). Chat prompts are rendered with the engine's `chat_template_kwargs`.
    """

    def __init__(
        self, engine: Engine, tokenizer: PreTrainedTokenizerBase | None, owns_engine: bool = True
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.owns_engine = owns_engine  # False: the caller's engine outlives the protocol

    @classmethod
    def load(cls, ref: str, engine: EngineConfig, tokenizer: str | None = None) -> Policy:
        """Build the policy engine for a model reference or URL, with its tokenizer."""
        from collabrl.models import load_tokenizer

        built = create_engine(ref, engine)
        if tokenizer is not None:
            return cls(built, load_tokenizer(tokenizer))
        return cls(built, getattr(built, "tokenizer", None))  # local engines carry theirs

    def require_tokenizer(self, protocol: str) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise UserError(
                f"the {protocol} protocol needs the policy's token ids, and the endpoint "
                f"{self.engine.name} does not say which tokenizer it uses",
                "pass --tokenizer with a local reference of the same model",
            )
        return self.tokenizer

    def prompt_ids(self, messages: list[ChatMessage]) -> list[int]:
        """The prompt in policy ids, rendered as the engine renders chat (its
        `chat_template_kwargs`); empty in text-only mode."""
        if self.tokenizer is None:
            return []
        options = getattr(self.engine, "chat_template_kwargs", None)
        return encode_prompt(self.tokenizer, messages, options)

    def encode(self, text: str) -> list[int]:
        """Ids of rendered text, special-token text (`<|im_start|>`) read as the special
        token: the policy's own text, or a prompt rendered by its chat template. Text
        someone else wrote goes through `encode_foreign`."""
        if not text or self.tokenizer is None:
            return []
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_foreign(self, text: str) -> list[int]:
        """Ids of text written by someone else (a tool, a teacher, an expert, the
        protocol), to append to the policy's context: see `encode_plain`."""
        if not text or self.tokenizer is None:
            return []
        return encode_plain(self.tokenizer, text)

    def continue_(self, contexts: list[Prompt], params: SamplingParams) -> list[Segment]:
        """One policy segment continuing every context, each within its own token budget
        (`params.prompt_budget`: the per-prompt `budgets`, else `max_tokens`).

        A context is the episode's visible ids (or, text-only, its chat prompt). The
        batch is one `generate` call in which every row asks for its own budget:
        sampling every row to the largest one wastes decoding, and a server with a tight
        `--max-model-len` refuses a long context asked for more than it has room for.
        Rows are still cut to their budget, for an engine that returns more than it was
        asked.
        """
        if not contexts:
            return []
        params.check_budgets(len(contexts))
        groups = self.engine.generate(contexts, dataclasses.replace(params, n=1))
        return [self._segment(g[0], params.prompt_budget(i)) for i, g in enumerate(groups)]

    def _segment(self, completion: Completion, budget: int) -> Segment:
        meta: dict[str, object] = {
            "finish_reason": completion.finish_reason,
            "stop_reason": completion.stop_reason,
        }
        if self.tokenizer is None:  # text-only: keep the server's own token count
            meta["reported_tokens"] = completion.completion_tokens
            return Segment(Author.POLICY, completion.text, [], None, meta)
        ids, logprobs = list(completion.token_ids), completion.logprobs
        # A server that gave no ids for what it generated (text, or a count of tokens):
        # encode its text. Its log-probs belong to the sampled tokens, not to these.
        if not ids and (completion.text or completion.completion_tokens):
            ids, logprobs = self.encode(completion.text), None
            meta["reencoded"] = True
        if len(ids) > budget:
            ids = ids[:budget]
            logprobs = logprobs[:budget] if logprobs is not None else None
            meta.update(finish_reason="length", stop_reason=None)
        # The text is what the ids decode to: a stop string may end inside the last
        # token, and an endpoint's text was encoded to get the ids in the first place.
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Segment(Author.POLICY, text, ids, logprobs, meta)

    def close(self) -> None:
        if self.owns_engine:
            self.engine.close()


# Per tokenizer, a copy of it that reads special-token text as plain text (weak keys:
# a tokenizer's copy goes with it).
_PLAIN: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_PLAIN_LOCK = threading.Lock()


def encode_plain(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Ids of `text` with special-token text split as plain text: `<|im_end|>` printed
    by a tool is those ten characters, not the end-of-turn token, so no one but the
    policy can end its turn or forge a new one in its context. Other added tokens (a
    template's `<tool_response>`) stay whole, as the chat template renders them.

    The per-call `split_special_tokens=True` of a fast tokenizer flips a flag its
    backend shares with every caller: a thread encoding a chat prompt in between would
    flip it back before this text is encoded. A private copy that always splits has no
    such window."""
    with _PLAIN_LOCK:
        plain = _PLAIN.get(tokenizer)
        if plain is None:
            plain = copy.deepcopy(tokenizer)
            plain.split_special_tokens = True
            _PLAIN[tokenizer] = plain
    return plain(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def environment(policy: Policy, text: str, **meta: object) -> Segment:
    """Protocol text (tags, notices) the policy is given, encoded in its tokenizer."""
    return Segment(Author.ENVIRONMENT, text, policy.encode_foreign(text), None, dict(meta))


def remaining(episode: Episode, params: SamplingParams) -> int:
    """Response tokens still allowed in this episode: a segment its protocol rolled back
    is out of the response and no longer counts (`Episode.response_ids`)."""
    return params.max_tokens - len(episode.response_ids)


def policy_turn(
    policy: Policy,
    episodes: list[Episode],
    params: SamplingParams,
    round_no: int,
    limit: int | None = None,
    **changes: object,
) -> list[Segment]:
    """The policy's next segment in every episode: one batched call, each within its
    remaining budget (and `limit`). Nothing is appended: the protocol reads them first."""
    if not episodes:
        return []
    budgets = [remaining(e, params) for e in episodes]
    if limit is not None:
        budgets = [min(limit, b) for b in budgets]
    batch = round_params(params, episodes, round_no, **changes).with_budgets(budgets)
    return policy.continue_([e.visible_ids for e in episodes], batch)


def append_if_room(episode: Episode, segments: list[Segment], params: SamplingParams) -> bool:
    """Append what a round brought back (returns, tool output); or, when it would use
    the last of the token budget (which bounds every author's tokens, and the policy
    needs one to go on), end the episode at LENGTH instead. True when appended."""
    if sum(len(s.token_ids) for s in segments) >= remaining(episode, params):
        episode.end = EndReason.LENGTH
        episode.segments[-1].meta["unanswered"] = str(episode.end)
        return False
    for segment in segments:
        episode.add(segment)
    return True


# Random streams of one episode's round: the policy, a planner, its collaborators.
POLICY_STREAM, PLANNER_STREAM, COLLABORATOR_STREAM = 0, 1, 2


def episode_seed(
    params: SamplingParams, episode: Episode, round_no: int, stream: int = POLICY_STREAM
) -> int | None:
    """The seed of one episode's round, from the run's seed (a trainer folds its step
    in), the problem, the sample index, the round and the random stream.

    vLLM and servers seed each request on its own, so a seed shared by a batch would
    make the samples of one problem identical (all GRPO advantages 0). Hashed, so every
    process derives the same seed for the same episode, whatever batch it is in.
    """
    if params.seed is None:
        return None
    return hashed_seed(
        params.seed, episode.problem_id, episode.meta.get("sample", 0), round_no, stream
    )


def collaborator_seeds(
    params: SamplingParams, episode: Episode, round_no: int, calls: int
) -> tuple[int, ...]:
    """The seeds of an episode's `calls` collaborator calls in one round (a teacher's
    one, an expert panel's K): from its COLLABORATOR_STREAM seed and each call's place
    among the episode's own calls, so that K experts asked alike do not answer alike,
    whatever else is in the round. Empty when the run is unseeded."""
    seed = episode_seed(params, episode, round_no, COLLABORATOR_STREAM)
    if seed is None:
        return ()
    return tuple(hashed_seed(seed, call) for call in range(calls))


def hashed_seed(seed: int, *key: object) -> int:
    """A seed for what `key` names, drawn from `seed`: the same in every process (unlike
    `hash()`), in [0, 2**31) as vLLM and servers take it."""
    text = "/".join(map(str, (seed, *key)))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big") >> 1


def episode_seeds(
    params: SamplingParams, episodes: list[Episode], round_no: int, stream: int = POLICY_STREAM
) -> tuple[int, ...]:
    """`episode_seed` of every episode, in order; empty when the run is unseeded."""
    if params.seed is None:
        return ()
    return tuple(episode_seed(params, e, round_no, stream) for e in episodes)  # type: ignore[misc]


def round_params(
    params: SamplingParams, episodes: list[Episode], round_no: int, **changes: object
) -> SamplingParams:
    """The sampling params of the policy's round `round_no` in `episodes`: one sample
    each, each seeded by its own episode (`episode_seeds`), whatever its batch."""
    seeds = episode_seeds(params, episodes, round_no)
    return dataclasses.replace(params, n=1, seeds=seeds, **changes)


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
