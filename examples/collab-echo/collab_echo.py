"""`echo`: a protocol plugin for collabrl. The policy answers; a collaborator (`--echo`, a
model reference or base URL) is shown the answer and repeats it back.

A toy, but a complete one: it declares a served collaborator with its own CLI flag, has an
options class of its own (`protocol.options`), refuses a setup without its collaborator, and
imports only `collabrl.plugin`, collabrl's public surface for plugins. collabrl finds it
through the entry point in pyproject.toml (group `collabrl.protocols`), so `collab infer
echo …`, `collab eval … --protocol echo` and `collab train grpo --protocol echo` run it
with no change to collabrl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

# collabrl's one import surface for plugins: nothing here reaches into its internals.
from collabrl.plugin import (
    Author,
    BuildContext,
    CallRecord,
    ChatMessage,
    Collaborator,
    Episode,
    MissingInput,
    Policy,
    PromptTemplate,
    ProtocolSpec,
    SamplingParams,
    Segment,
    Task,
    collaborator_engine,
    collaborator_params,
    collaborator_pool,
    collaborator_seeds,
    finish,
    is_stand_in,
    new_episodes,
    option,
    policy_turn,
    remaining,
    segment_end,
)

if TYPE_CHECKING:
    from collabrl.plugin import ExpertPool, ProtocolConfig


@dataclass
class EchoOptions:
    """The echo protocol's options: `--set protocol.options.KEY=VALUE` (or `--echo`)."""

    echo: str | None = option(
        None,
        "echo: the collaborator that repeats the policy's answer, a model reference or a "
        "base URL; 'reference' is a stand-in that writes the gold answer (tests only).",
    )
    repeat: int = option(
        1,
        "Times the collaborator repeats the answer back (0: never asked). The policy and "
        "each echo get an equal share of the episode's token budget.",
    )
    timeout: float = option(600.0, "Seconds one echo call may take.")


ECHO = Collaborator("echo", key="options.echo", flag="--echo", served=True, author=Author.EXPERT)


def echo_messages(answer: str) -> list[ChatMessage]:
    """What the collaborator is asked."""
    return [{"role": "user", "content": f"Repeat this answer back, word for word:\n\n{answer}"}]


class EchoProtocol:
    name = "echo"  # every episode's meta["protocol"]

    def __init__(
        self,
        policy: Policy,
        echo: ExpertPool | None,  # None: never asked (repeat 0)
        template: PromptTemplate,
        extract: tuple[str, ...],
        repeat: int,
    ) -> None:
        self.policy = policy
        self.echo = echo
        self.template = template
        self.extract = extract
        self.repeat = repeat

    def run(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        episodes = new_episodes(self.policy, self.template, tasks, self.name)
        # The policy writes within its share of the episode's budget, each echo in another.
        share = max(1, params.max_tokens // (self.repeat + 1))
        answers = policy_turn(self.policy, episodes, params, 0, limit=share)
        for episode, answer in zip(episodes, answers, strict=True):
            episode.add(answer)
            episode.end = segment_end(answer)
        for round_no in range(1, self.repeat + 1):
            self._echo(episodes, tasks, params, round_no, share)
        for episode in episodes:
            # The answer is the policy's own: the echo only repeats it.
            finish(episode, lambda e: e.segments[0].text, self.extract)
        return episodes

    def _echo(
        self,
        episodes: list[Episode],
        tasks: list[Task],
        params: SamplingParams,
        round_no: int,
        share: int,
    ) -> None:
        """Show every episode's answer to the collaborator and append what it says back,
        in at most `share` tokens of the episode's budget (which bounds every author's)."""
        assert self.echo is not None  # built whenever repeat >= 1
        asking = [(e, t) for e, t in zip(episodes, tasks, strict=True) if remaining(e, params)]
        if not asking:
            return
        calls = [(1, echo_messages(e.segments[0].text), t.reference) for e, t in asking]
        # Each call seeded by its own episode, so that a group's samples differ.
        seeds = tuple(s for e, _ in asking for s in collaborator_seeds(params, e, round_no, 1))
        budgets = [min(share, remaining(e, params)) for e, _ in asking]
        asked = collaborator_params(seeds, budgets, params.temperature, params.top_p, params.top_k)
        for (episode, _), record in zip(asking, self.echo.ask_sync(calls, asked), strict=True):
            episode.add(self._segment(record, remaining(episode, params)))

    def _segment(self, record: CallRecord, budget: int) -> Segment:
        """The echo in policy ids (what the policy would be conditioned on), cut to `budget`."""
        text, ids = record.text or "", self.policy.encode_foreign(record.text or "")[:budget]
        if self.policy.tokenizer is not None:
            text = self.policy.tokenizer.decode(ids, skip_special_tokens=True)
        meta = {"outcome": record.outcome, "endpoint": record.endpoint}
        return Segment(Author.EXPERT, text, ids, None, meta)

    def close(self) -> None:
        self.policy.close()
        if self.echo is not None:
            self.echo.close()


def build_echo(ctx: BuildContext) -> EchoProtocol:
    options: EchoOptions = ctx.options
    echo = None
    if options.echo and options.repeat:
        echo = collaborator_pool(
            [options.echo],
            options.timeout,
            collaborator_engine(ctx.engine, ctx.config.chat_template_kwargs),
            tokenizer=ctx.policy.tokenizer,  # the `reference` stand-in counts policy tokens
        )
    return EchoProtocol(ctx.policy, echo, ctx.template, ctx.extract, options.repeat)


def check_echo(config: ProtocolConfig) -> None:
    """Refuse a run without its collaborator, before any model loads. `protocol.options`
    is still the raw mapping here (the registry has checked it against EchoOptions)."""
    if not config.options.get("echo"):
        # Name the flag: a command without it (`collab config show`) says `--set` instead.
        raise MissingInput("the echo protocol needs a collaborator", "pass --echo MODEL_OR_URL")


def echo_uses_reference(config: ProtocolConfig) -> bool:
    echo = config.options.get("echo")
    return bool(echo) and is_stand_in(str(echo))


SPEC = ProtocolSpec(
    name="echo",
    help="the policy answers and a collaborator (--echo) repeats the answer back",
    build=build_echo,
    collaborators=(ECHO,),
    check=check_echo,
    uses_reference=echo_uses_reference,
    options=EchoOptions,
)
