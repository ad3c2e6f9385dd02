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
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from collabrl.config import EngineConfig
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
from collabrl.protocols.seeds import round_params

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


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
