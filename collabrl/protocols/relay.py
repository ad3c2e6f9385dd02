"""`relay` (RelayLLM): the policy hands the pen to a teacher for n tokens at a time.

The policy generates until the stop string `</call>`. A well-formed `<call>n</call>`
pauses it: the teacher receives the problem and everything written so far *with
every call command stripped*, as a partial assistant reply in the teacher's own
chat template (its tokenizer may differ), and writes up to n tokens (fewer at its
EOS). Those tokens are appended as a teacher segment and the policy resumes from
its full history, *its own commands included*. A teacher reply that ends at the
teacher's EOS completes the answer, and the episode ends there, as in RelayLLM's code
(`relay.continue_after_teacher_eos` lets the policy go on instead).

The stop string may end inside a token (SmolLM2 has `>.`, `>,`, `>)`, `>"`): the
segment's ids then hold a few characters past `</call>`. They are the policy's, so
they stay in its text and ids; the command is read up to the stop string.

The released RelayLLM code drops the command and the student's last segment before
appending the teacher text; by default nothing the policy wrote is dropped here.
`relay.rollback` does as that code does: the teacher is asked with the text before the
`<call>` tag, and once it has answered, the policy segment that made the call is marked
rolled back (`Segment.rolled_back`): it stays in the record for readers, but the
teacher's text follows what came before it, the policy resumes from that, and every
token view (what a trainer sees, the budget, the ratios) skips it. Either way the
trajectory a trainer sees is exactly the one the policy was conditioned on. With
`relay.train_teacher_tokens` the teacher's segments are marked trained
(`Segment.trained`): a trainer puts them in the loss, as that code does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collabrl.data.prompts import PromptTemplate
from collabrl.engines.base import ChatMessage, SamplingParams
from collabrl.engines.reference import is_stand_in
from collabrl.episode import ROLLED_BACK, TRAINED, Author, EndReason, Episode, Segment
from collabrl.errors import MissingInput, UserError
from collabrl.protocols.base import Policy, Task, remaining
from collabrl.protocols.collaborators import (
    collaborator_engine,
    collaborator_params,
    collaborator_pool,
)
from collabrl.protocols.parsing import CALL_CLOSE, CALL_OPEN, parse_relay_call, strip_call_commands
from collabrl.protocols.relay_config import RelayConfig
from collabrl.protocols.rounds import finish, guard, new_episodes, run_rounds, segment_end
from collabrl.protocols.seeds import collaborator_seeds
from collabrl.protocols.spec import BuildContext, Collaborator, PolicyPrompt, ProtocolSpec

if TYPE_CHECKING:
    from collabrl.engines.calls import CallRecord
    from collabrl.engines.pool import ExpertPool
    from collabrl.protocols.config import ProtocolConfig


@dataclass(frozen=True)
class RelayStep:
    """What a policy segment asks for: a teacher call of n tokens, or nothing."""

    n: int | None = None  # tokens granted to the teacher; None: no call this time
    requested: int | None = None  # the n the command asked for (ρ requested counts it)
    error: str | None = None  # a malformed or refused command, recorded on the segment
    done: bool = False  # the episode is over (EOS, length, or no budget left)


def relay_step(
    text: str, stop_reason: str | None, calls_made: int, budget: int, config: RelayConfig
) -> RelayStep:
    """Decide what follows a policy segment. Pure, and total over any text."""
    if stop_reason != CALL_CLOSE:
        # EOS or length: the episode ends; a dangling `<call>` is still a format error.
        call = parse_relay_call(text, config.max_call_tokens)
        return RelayStep(error=call.error if call else None, done=True)
    if budget <= 0:
        return RelayStep(done=True)
    call = parse_relay_call(command_text(text), config.max_call_tokens)
    if call is None:
        return RelayStep(error=f"{CALL_CLOSE} without {CALL_OPEN}")
    if not call.ok:
        return RelayStep(error=call.error)
    if config.teacher_free:  # the bad-words ban missed a spelling: answer nothing
        return RelayStep(error="call in teacher-free mode")
    if calls_made >= config.max_calls:
        return RelayStep(error=f"call limit ({config.max_calls}) reached")
    n = config.fixed_k or call.n
    return RelayStep(n=min(n, budget), requested=call.n)


def command_text(text: str) -> str:
    """A segment that stopped at `</call>`, up to that tag: the token that completed the
    stop string may carry characters past it (`>.`), which are not the command's."""
    return text[: text.rfind(CALL_CLOSE) + len(CALL_CLOSE)]


# The episode meta key, and the trainer's extra, of `call_commands`.
CALL_COMMANDS = "call_commands"


def call_commands(episode: Episode, max_n: int) -> int:
    """The well-formed `<call>n</call>` commands left in the response (kept policy
    segments that stopped at one): every call made, served or not, unless `relay.rollback`
    took the served ones out; then only the unserved ones, the calls the authors' reward
    can still see (refused at the call limit, sent to a teacher that failed, or made
    with no budget left). A malformed command is a format error, not a call."""
    count = 0
    for segment in episode.kept:
        if segment.author is not Author.POLICY or segment.meta.get("stop_reason") != CALL_CLOSE:
            continue
        call = parse_relay_call(command_text(segment.text), max_n)
        count += call is not None and call.ok
    return count


def text_before_call(episode: Episode) -> str:
    """The response up to the `<call>` of the command its last segment ends with: what the
    authors' rollout asks the teacher to continue, before it rolls that segment back."""
    *before, last = episode.kept
    # relay_step granted the call, so the segment holds its `<call>`.
    return "".join(s.text for s in before) + last.text[: last.text.rfind(CALL_OPEN)]


def teacher_messages(template: PromptTemplate, question: str, written: str) -> list[ChatMessage]:
    """The teacher's prompt: the problem, and the reply so far with calls stripped."""
    messages = template.messages(question)
    partial = strip_call_commands(written)
    # An empty partial reply cannot be "continued"; the teacher then starts the reply.
    if partial.strip():
        messages.append({"role": "assistant", "content": partial})
    return messages


class RelayProtocol:
    name = "relay"

    def __init__(
        self,
        policy: Policy,
        teacher: ExpertPool | None,
        template: PromptTemplate,
        config: RelayConfig,
        extract: tuple[str, ...],
    ) -> None:
        config.check()
        policy.require_tokenizer(self.name)
        if teacher is None and not config.teacher_free:
            raise UserError(
                "the relay protocol needs a teacher",
                "pass --teacher, or --set protocol.relay.teacher_free=true",
            )
        self.policy = policy
        self.teacher = teacher
        self.template = template
        self.config = config
        self.extract = extract

    # -- the loop --------------------------------------------------------------------------

    def run(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        episodes = new_episodes(self.policy, self.template, tasks, self.name)
        banned = (CALL_OPEN, CALL_CLOSE) if self.config.teacher_free else ()

        def after_policy(i: int, segment: Segment) -> RelayStep | None:
            return self._after_policy(episodes[i], segment, params)

        def serve(pauses: list[tuple[int, RelayStep]], round_no: int) -> list[int]:
            calls = [(i, step) for i, step in pauses if step.n is not None]
            self._ask_teacher(episodes, tasks, calls, params, round_no)
            return [i for i, _ in pauses if episodes[i].end is None]

        run_rounds(self.policy, episodes, params, (CALL_CLOSE,), after_policy, serve, banned)
        for episode in episodes:
            finish(episode, lambda e: strip_call_commands(e.response_text), self.extract)
            # What the per-call ρ charges under rollback (train/rewards.py `charged_ratios`).
            episode.meta[CALL_COMMANDS] = call_commands(episode, self.config.max_call_tokens)
        return episodes

    def _after_policy(
        self, episode: Episode, segment: Segment, params: SamplingParams
    ) -> RelayStep | None:
        """Read the segment's command; None (with the end set) when the episode is over."""
        step = relay_step(
            segment.text,
            segment.meta.get("stop_reason"),
            len(episode.calls),
            remaining(episode, params),
            self.config,
        )
        if step.error:
            segment.meta["call_error"] = step.error
            episode.meta["format_errors"] = episode.meta.get("format_errors", 0) + 1
        if not step.done:
            return step
        called = segment.meta.get("stop_reason") == CALL_CLOSE  # a call with no budget left
        episode.end = EndReason.LENGTH if called else segment_end(segment)
        return None

    def _ask_teacher(
        self,
        episodes: list[Episode],
        tasks: list[Task],
        calls: list[tuple[int, RelayStep]],
        params: SamplingParams,
        round_no: int,
    ) -> None:
        """Send this round's calls, each asking for its own n tokens, all at once.

        Each call carries its task's reference, which only the `reference` stand-in reads.
        """
        if not calls:
            return
        assert self.teacher is not None  # relay_step grants no call in teacher-free mode
        asked = [
            (
                1,
                teacher_messages(self.template, tasks[i].question, self._written(episodes[i])),
                tasks[i].reference,
            )
            for i, _ in calls
        ]
        # Each call with its own n and its episode's seed (the teacher samples the n
        # tokens; calls of a group's samples must not share one seed).
        seeds = tuple(
            seed for i, _ in calls for seed in collaborator_seeds(params, episodes[i], round_no, 1)
        )
        batch = self._teacher_params(params, seeds, [step.n for _, step in calls])
        for (i, step), record in zip(calls, self.teacher.ask_sync(asked, batch), strict=True):
            # A reply that cannot be taken in fails its own episode, not the round.
            guard(episodes[i], self._take_reply, episodes[i], record, step, params)

    def _written(self, episode: Episode) -> str:
        """The text the teacher continues (its commands stripped by `teacher_messages`):
        everything written so far, or, under rollback, what comes before the `<call>` tag,
        as the authors' rollout sends it."""
        return text_before_call(episode) if self.config.rollback else episode.response_text

    def _take_reply(
        self, episode: Episode, record: CallRecord, step: RelayStep, params: SamplingParams
    ) -> None:
        """Append the teacher's reply; its EOS ends the episode (unless configured not to).

        Under rollback, a call the teacher answered first takes the policy segment that
        made it out of the context (the authors' rollout); a failed call leaves it, its
        command included, and the policy goes on after it. The teacher's tokens are then
        bounded by the budget left without the rolled-back ones, which no longer count.
        """
        if self.config.rollback and record.ok:
            episode.segments[-1].meta[ROLLED_BACK] = True  # the segment that made the call
        segment = episode.add(self._teacher_segment(record, step, remaining(episode, params)))
        if segment.meta.get("teacher_eos") and not self.config.continue_after_teacher_eos:
            episode.end = EndReason.TEACHER_EOS

    def _teacher_params(
        self, params: SamplingParams, seeds: tuple[int, ...], budgets: list[int]
    ) -> SamplingParams:
        """The calls' own seeds and n, at the teacher's own temperature (the policy's
        unless `relay.teacher_temperature` is set) and the policy's nucleus."""
        temperature = self.config.teacher_temperature
        if temperature is None:
            temperature = params.temperature
        return collaborator_params(seeds, budgets, temperature, params.top_p, params.top_k)

    def _teacher_segment(self, record: CallRecord, step: RelayStep, budget: int) -> Segment:
        text = record.text or ""
        ids = self.policy.encode_foreign(text)
        # A reply that stopped short of its n tokens ended at the teacher's EOS (no stop
        # strings are sent): the teacher considers the answer complete.
        eos = record.finish_reason == "stop"
        if len(ids) > budget:
            # n counts teacher tokens; in the policy tokenizer the text may run past the
            # episode's budget, which bounds every author's tokens.
            ids = ids[:budget]
            text = self.policy.tokenizer.decode(ids, skip_special_tokens=True)
            eos = False
        meta = {
            "requested_tokens": step.requested,
            "granted_tokens": step.n,
            "teacher_eos": eos,
            "teacher_tokens": record.completion_tokens,
            "outcome": record.outcome,
            "endpoint": record.endpoint,
            "latency_s": round(record.latency_s, 4),
        }
        if record.error:
            meta["error"] = record.error
        if self.config.train_teacher_tokens:
            meta[TRAINED] = True
        return Segment(Author.TEACHER, text, ids, None, meta)

    def close(self) -> None:
        self.policy.close()
        if self.teacher is not None:
            self.teacher.close()


# -- the spec --------------------------------------------------------------------------

TEACHER = Collaborator(
    "teacher", key="teacher", flag="--teacher", served=True, author=Author.TEACHER
)


def build_relay(ctx: BuildContext) -> RelayProtocol:
    config = ctx.config
    teacher = None
    if config.teacher:
        teacher = collaborator_pool(
            [config.teacher],
            config.relay.teacher_timeout,
            collaborator_engine(ctx.engine, config.chat_template_kwargs),
            # `<call>n</call>` grants the `reference` stand-in n tokens of the policy's own.
            tokenizer=ctx.policy.tokenizer,
        )
    return RelayProtocol(ctx.policy, teacher, ctx.template, config.relay, ctx.extract)


def relay_extras(episode: Episode) -> dict[str, Any]:
    """What a trainer reads of a relay episode besides the common extras: the commands
    left in its response, which the per-call ρ charges under rollback."""
    return {CALL_COMMANDS: int(episode.meta.get(CALL_COMMANDS, 0))}


def check_relay(config: ProtocolConfig) -> None:
    if not config.teacher and not config.relay.teacher_free:
        raise MissingInput(
            "the relay protocol needs a teacher",
            "pass --teacher MODEL_OR_URL, or --set protocol.relay.teacher_free=true",
        )


def relay_uses_reference(config: ProtocolConfig) -> bool:
    return bool(config.teacher) and is_stand_in(config.teacher) and not config.relay.teacher_free


SPEC = ProtocolSpec(
    name="relay",
    help="RelayLLM, the policy hands the pen to a teacher (--teacher) for n tokens",
    build=build_relay,
    section="relay",
    prompt=PolicyPrompt.DEFAULT,
    collaborators=(TEACHER,),
    check=check_relay,
    uses_reference=relay_uses_reference,
    call_syntax="<call>n</call>",
    calls=lambda config: not config.relay.teacher_free,
    episode_extras=relay_extras,
    grpo=False,
)
