"""The Episode: one trajectory, as an ordered record of who wrote which tokens.

Each method of the toolkit is a conversation between several producers of
text — the policy, a teacher, experts, a planner's guidance, tools, the
environment — that ends in an answer. An `Episode` holds the prompt and the
`Segment`s in order; each segment says who wrote it and carries its token ids
*in the policy's tokenizer*, exactly the ids the policy was conditioned on, so
training never re-tokenizes text (which can split differently and shift the
loss mask). Everything else — loss masks, call ratios, transcripts, metrics —
is a view computed here.

A protocol may *roll back* a segment (relay's `rollback`, as the released RelayLLM
code does with the student's segment that made a served call): it stays in `segments`,
marked `meta["rolled_back"]`, so that transcripts show what was written, but it leaves
the policy's context. Every token view (ids, text, loss mask, log-probs, counts and
ratios) reads the kept segments only, so what a trainer sees is still exactly what the
policy was conditioned on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Author(StrEnum):
    POLICY = "policy"
    TEACHER = "teacher"
    EXPERT = "expert"
    GUIDANCE = "guidance"  # a planner's injected strategy text
    TOOL = "tool"
    ENVIRONMENT = "environment"  # protocol text: tags, "unavailable" notices, …


# Authors whose tokens count as help in a call ratio.
HELPERS = frozenset({Author.TEACHER, Author.EXPERT})

# The `Segment.meta` key by which a protocol puts a segment the policy did not write into
# the loss (`Segment.trained`).
TRAINED = "trained"

# The `Segment.meta` key by which a protocol takes a segment out of the context it goes on
# from (`Segment.rolled_back`): kept for readers, skipped by every token view.
ROLLED_BACK = "rolled_back"


class EndReason(StrEnum):
    """Why an episode stopped. Every protocol sets one; trainers read it (truncation)."""

    EOS = "eos"  # the policy ended its answer with its end-of-sequence token
    LENGTH = "length"  # the episode's token budget ran out: the response is truncated
    TURN_BUDGET = "turn_budget"  # consult: a call made on the last allowed policy turn
    TEACHER_EOS = "teacher_eos"  # relay: the teacher's reply ended the answer (its EOS)
    TERMINAL = "terminal"  # strategy: the planner chose terminal; the last step is written
    MAX_STEPS = "max_steps"  # strategy: the planner's step limit was reached
    # No policy token at all (a budget smaller than the first guidance, an endpoint that
    # answered EOS at once): nothing to train on. Trainers send it masked and count it
    # (`collabrl.train.episodes`).
    EMPTY = "empty"
    # Serving one of its pauses (a tool run, a teacher's or expert's reply, a planner
    # step) or reading its segment raised: the episode stops there, the error in
    # `meta["error"]`, with no answer; the rest of its batch goes on. Trainers send it
    # masked, as EMPTY, and count it (`collabrl.train.episodes`).
    ERROR = "error"

    @property
    def truncated(self) -> bool:
        """The policy was cut off, not done: trainers may mask such completions."""
        return self is EndReason.LENGTH


@dataclass
class Segment:
    """A run of tokens written by one author."""

    author: Author
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None  # the policy's sampling log-probs (policy segments)
    # Call details (expert id, requested_tokens, accepted, latency_s, error, …).
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.author = Author(self.author)
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"{len(self.logprobs)} log-probs for {len(self.token_ids)} tokens in a "
                f"{self.author} segment"
            )

    @property
    def is_helper(self) -> bool:
        return self.author in HELPERS

    @property
    def rolled_back(self) -> bool:
        """Its protocol took it out of the context (`meta["rolled_back"]`): it was written,
        but nothing after it was conditioned on it, so no token view counts it."""
        return bool(self.meta.get(ROLLED_BACK))

    @property
    def trained(self) -> bool:
        """Its tokens are in the loss: the policy's own, and those of another author that
        the protocol marks `meta["trained"]` (relay's teacher under
        `relay.train_teacher_tokens`, as the released RelayLLM code trains on them); never
        those of a rolled-back segment, which are not in the sequence trained on."""
        if self.rolled_back:
            return False
        return self.author is Author.POLICY or bool(self.meta.get(TRAINED))

    @property
    def shown_text(self) -> str:
        """Its text for a reader; a collaborator call that came back empty (a failure) says
        so instead of showing nothing, and a rolled-back segment says it was."""
        if self.rolled_back:
            return f"[rolled back: {self.text}]"
        if self.is_helper and not self.text:
            return f"[{self.author} unavailable: {self.meta.get('error') or 'no answer'}]"
        return self.text


@dataclass
class Episode:
    """A problem, the prompt the policy saw, and the segments that followed."""

    problem_id: str
    prompt_ids: list[int]
    segments: list[Segment] = field(default_factory=list)
    answer: str | None = None
    end: EndReason | None = None  # set by the protocol when the episode is over
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.end is not None:
            self.end = EndReason(self.end)

    def add(self, segment: Segment) -> Segment:
        self.segments.append(segment)
        return segment

    # -- token views -------------------------------------------------------------

    @property
    def kept(self) -> list[Segment]:
        """The segments of the response, in order: all but the rolled-back ones."""
        return [s for s in self.segments if not s.rolled_back]

    @property
    def response_ids(self) -> list[int]:
        """Every token after the prompt, in order, whoever wrote it (kept segments)."""
        return [t for s in self.kept for t in s.token_ids]

    @property
    def visible_ids(self) -> list[int]:
        """What the policy is conditioned on when it writes next: prompt + kept segments."""
        return self.prompt_ids + self.response_ids

    @property
    def response_text(self) -> str:
        return "".join(s.text for s in self.kept)

    def loss_mask(self) -> list[int]:
        """1 on tokens the policy sampled, 0 on everything it was given (TRL's env_mask),
        except a given segment its protocol marks trained (`Segment.trained`)."""
        return [int(s.trained) for s in self.kept for _ in s.token_ids]

    def response_logprobs(self) -> list[float] | None:
        """Log-probs aligned with `response_ids`: the policy's own, 0.0 where others
        wrote (a trainer masks those out), NaN where others wrote tokens that are trained
        all the same (`Segment.trained`). None when a policy segment has none.

        Those tokens were never sampled by the policy, so they have no sampling log-prob;
        0.0 would claim the sampler gave them probability 1 and skew TRL's importance
        ratio, while TRL reads NaN as "no correction" (ratio 1 on the policy's own
        log-prob).
        """
        values: list[float] = []
        for s in self.kept:
            if s.author is Author.POLICY:
                if s.logprobs is None:
                    return None
                values.extend(s.logprobs)
            else:
                values.extend([math.nan if s.trained else 0.0] * len(s.token_ids))
        return values

    # -- counts and ratios -------------------------------------------------------

    def tokens_by(self, *authors: Author) -> int:
        """Response tokens written by `authors` (kept segments: what budgets and ratios count)."""
        return sum(len(s.token_ids) for s in self.kept if s.author in authors)

    @property
    def calls(self) -> list[Segment]:
        """One helper segment per call, failed calls included (empty text, `meta.error`)."""
        return [s for s in self.segments if s.is_helper]

    @property
    def tool_calls(self) -> list[Segment]:
        """One tool segment per call (apollo), failed calls with `meta["error"]` set."""
        return [s for s in self.segments if s.author is Author.TOOL]

    @property
    def tool_errors(self) -> int:
        return sum(s.meta.get("error") is not None for s in self.tool_calls)

    @property
    def turns(self) -> int:
        """Policy segments: how many times the policy took the pen (rolled back or not)."""
        return sum(s.author is Author.POLICY for s in self.segments)

    def call_ratio_realised(self) -> float:
        """RelayLLM's ρ on what happened: helper tokens in the response ÷ all of them."""
        total = len(self.response_ids)
        return self.tokens_by(*HELPERS) / total if total else 0.0

    @property
    def reencoded(self) -> bool:
        """Some policy ids were re-encoded from an endpoint's text, not the sampled ids:
        the loss would be computed on tokens the policy never produced."""
        return any(s.author is Author.POLICY and s.meta.get("reencoded") for s in self.kept)

    def requested_helper_tokens(self) -> int:
        """Helper tokens the policy asked for (what came back, for calls that name none)."""
        return sum(_requested(s) for s in self.calls)

    def call_ratio_requested(self) -> float:
        """RelayLLM's ρ on what the policy *asked for*: requested ÷ (own + requested).

        A call's request is `meta["requested_tokens"]`: the n of its `<call>n</call>`
        as written (only a request beyond `relay.max_call_tokens` is cut to it), before
        the episode budget or fixed-k change what is granted. Calls that name no count
        (an expert query) count what came back. Own tokens are every response token not
        written by a helper. docs/protocols/README.md defines both ratios.
        """
        requested = self.requested_helper_tokens()
        own = len(self.response_ids) - self.tokens_by(*HELPERS)
        total = own + requested
        return requested / total if total else 0.0

    # -- storage -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for segment in data["segments"]:
            segment["author"] = str(segment["author"])
        data["end"] = None if self.end is None else str(self.end)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        segments = [Segment(**s) for s in data.get("segments", [])]
        return cls(
            problem_id=data["problem_id"],
            prompt_ids=list(data["prompt_ids"]),
            segments=segments,
            answer=data.get("answer"),
            end=data.get("end"),
            meta=dict(data.get("meta", {})),
        )


def _requested(segment: Segment) -> int:
    value = segment.meta.get("requested_tokens")
    return int(value) if value is not None else len(segment.token_ids)
