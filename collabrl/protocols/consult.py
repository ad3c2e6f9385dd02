"""`consult` (EAPO): the policy may ask a panel of K experts, in parallel, mid-answer.

Open mode (training, and the paper's offline Expert-Assisted Workflow baseline): the
policy gets the training prompt of EAPO appendix D and writes until `</agent_calls>`.
The calls of that block go to the expert pool — the valid queries of every episode of
a round in one `ask`, so local experts are batched — and the answers come back as one
`<agent_returns>` block (`agent_returns_pieces(...)`, joined). Each answer
that returned is written into the history only with probability ρ (`accept_prob`,
which the trainer anneals as ρ_s = 1/s); a call that failed, was rejected by ρ or came
after the query budget reads "unavailable". The policy then resumes on a fresh line,
until EOS, the token budget or the turn budget.

Locked mode (evaluation): the paper's evaluation prompt, one policy turn, no experts.

In the Episode the returns block is split by author: the JSON scaffolding is
environment text and each call's result is one expert segment, so expert tokens count
as help in `Episode.call_ratio_*` and carry no loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines.base import ChatMessage, SamplingParams
from collabrl.engines.reference import is_stand_in
from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.errors import MissingInput, UserError
from collabrl.protocols.base import (
    Policy,
    Task,
    append_if_room,
    environment,
    policy_turn,
    remaining,
)
from collabrl.protocols.collaborators import (
    collaborator_engine,
    collaborator_params,
    collaborator_pool,
)
from collabrl.protocols.consult_config import ConsultConfig
from collabrl.protocols.parsing import (
    AGENT_CALLS_CLOSE,
    AGENT_CALLS_OPEN,
    AGENT_RETURNS_CLOSE,
    AGENT_RETURNS_OPEN,
    ExpertQuery,
    agent_returns_pieces,
    parse_agent_calls,
    strip_blocks,
)
from collabrl.protocols.rounds import finish, guard, new_episodes, run_rounds, segment_end
from collabrl.protocols.seeds import collaborator_seeds
from collabrl.protocols.spec import BuildContext, Collaborator, Flag, PolicyPrompt, ProtocolSpec

if TYPE_CHECKING:  # the pool brings in the HTTP client: not needed to check a config
    from collabrl.engines.calls import CallRecord
    from collabrl.engines.pool import ExpertPool
    from collabrl.engines.reference import Reference
    from collabrl.protocols.config import ProtocolConfig

QUERY_BUDGET_SPENT = "query budget spent"


# ----------------------------------------------------------------------------- the prompt

_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

# EAPO appendix D, "Prompts during Training", verbatim but for the three places that
# depend on K and the query budget. The PDF's code formatting (backticks, a stray `>`
# after <agent_returns>) is dropped: it is typesetting, not prompt text.
_TRAINING_SYSTEM = """\
You are a helpful assistant that can solve a given question step by step. \
To do so, you can consult with a panel of {k_word} experts. \
Each question you can ask experts {budget} times totally.
You can ask one or more experts for their opinion. You can ask them the same question or \
different questions simultaneously. The experts will provide their answers, which you can use \
to form your final response. The agent call query and results are enclosed within \
<agent_calls> </agent_calls> and <agent_returns> </agent_returns> tags respectively.
Agent calls query should be formatted as a list of dictionaries.
For each agent call (an item in the list), you need to provide these keys:
(1) expert_id (int): Required. The ID of the expert you want to consult. Can be {ids_or}.
(2) input_parameters (dict): Required. All input parameters for the expert, in dictionary format.
Here are the experts you can use:
Description:
This is a panel of {k_word} auxiliary intelligent agents (ID {ids_list}) that you can consult \
when you are unsure about the answer to a question. The agents' responses may not always be \
correct, but they can offer you alternative perspectives to help you think further.
Parameters:
(1) query (str): Required. The query string describing the question you want to ask or discuss.
(2) The answer from the agent, including thinking process.
The reasoning process is wrapped by <think></think>.
The final answer begins with "Answer: ".
For example:
User: What is the capital city of NomanLand and what is its main export?
Assistant:
<think>
This question has two parts. I will ask two different experts to answer each part. \
I'll ask expert 1 about the capital and expert 2 about the main export.
</think>
<agent_calls>
[{"expert_id": 1, "input_parameters": {"query": "capital city of NomanLand"}}, \
{"expert_id": 2, "input_parameters": {"query": "main export of NomanLand"}}]
</agent_calls>
<agent_returns>
[{"expert_id": 1, "result": "The capital city of NomanLand is NomanCity."}, \
{"expert_id": 2, "result": "The main export of NomanLand is widgets."}]
</agent_returns>
<think>
I see. Expert 1 says the capital is NomanCity, and Expert 2 says the main export is widgets.
</think>
Answer: The capital of NomanLand is NomanCity and its main export is widgets."""


def _either(items: list[str]) -> str:
    """'1', '1 or 2', '1, 2, or 3' — the paper's "Can be 1, 2, or 3" for any K."""
    if len(items) <= 2:
        return " or ".join(items)
    return ", ".join(items[:-1]) + ", or " + items[-1]


def training_prompt(num_experts: int, query_budget: int) -> PromptTemplate:
    """The appendix-D training prompt for a panel of `num_experts` and a query budget."""
    ids = [str(i) for i in range(1, num_experts + 1)]
    k_word = _NUMBER_WORDS[num_experts] if num_experts < len(_NUMBER_WORDS) else str(num_experts)
    system = (
        _TRAINING_SYSTEM.replace("{k_word}", k_word)
        .replace("{budget}", str(query_budget))
        .replace("{ids_or}", _either(ids))
        .replace("{ids_list}", ", ".join(ids))
    )
    return PromptTemplate(
        name="eapo-train",
        system=system,
        user="{problem}",
        extract=("answer_line", "boxed"),
        source="EAPO appendix D (prompt during training), rendered for K and the query budget",
    )


def policy_template(config: ConsultConfig) -> PromptTemplate:
    """The prompt the policy answers in: appendix D's training prompt in open mode, the
    evaluation prompt (no experts) locked."""
    if config.mode == "open":
        return training_prompt(config.num_experts, config.query_budget)
    return get_prompt("eapo-eval")


def expert_messages(query: str) -> list[ChatMessage]:
    """An expert's prompt: the paper's evaluation system prompt, the query as the user turn.

    The paper does not print its expert prompt; this one asks for the same "Answer:" line
    the training prompt tells the policy to expect from the experts.
    """
    return get_prompt("eapo-eval").messages(query)


# ----------------------------------------------------------------------------- one turn


@dataclass(frozen=True)
class ConsultTurn:
    """What follows one policy segment: the calls to answer, and what was wrong."""

    called: bool  # the segment ended at `</agent_calls>`: the policy waits for returns
    queries: tuple[ExpertQuery, ...] = ()  # valid calls within the query budget: to send
    over_budget: tuple[ExpertQuery, ...] = ()  # valid calls past it: answered "unavailable"
    errors: tuple[str, ...] = ()  # format errors, recorded on the policy segment


def consult_turn(
    text: str, stop_reason: str | None, num_experts: int, queries_left: int
) -> ConsultTurn:
    """Decide what a policy segment asks for. Pure, and total over any text.

    Generation stops at `</agent_calls>`, so a call is made exactly when that stop
    string ended the segment. A segment that ended otherwise (EOS, length) sends
    nothing, but a dangling `<agent_calls>` in it is still a format error.
    """
    called = stop_reason == AGENT_CALLS_CLOSE
    calls = parse_agent_calls(text, num_experts, max_calls=num_experts)
    if calls is None:
        missing_open = called or AGENT_CALLS_CLOSE in text
        errors = (f"{AGENT_CALLS_CLOSE} without {AGENT_CALLS_OPEN}",) if missing_open else ()
        return ConsultTurn(called, errors=errors)
    if not called:
        # Only an engine that ignores the stop string gets here with a complete block.
        return ConsultTurn(False, errors=calls.errors or ("calls not answered: no stop",))
    left = max(queries_left, 0)
    return ConsultTurn(True, calls.queries[:left], calls.queries[left:], calls.errors)


# ----------------------------------------------------------------------------- the returns


@dataclass(frozen=True)
class Reply:
    """One call's fate: what the history shows, and the record for metrics."""

    expert_id: int
    result: str | None  # written into the history; None reads "unavailable"
    meta: dict[str, Any]


def returns_pieces(results: list[tuple[int, str | None]]) -> list[str]:
    """The `<agent_returns>` block as the history holds it, cut by author
    (`agent_returns_pieces`).

    The block sits on its own line: a newline before it (after `</agent_calls>`, as in
    the paper's example) and one after it, so the policy resumes on a fresh line.
    """
    pieces = agent_returns_pieces(results)
    pieces[0] = "\n" + pieces[0]
    pieces[-1] = pieces[-1] + "\n"
    return pieces


def returns_segments(policy: Policy, replies: list[Reply]) -> list[Segment]:
    """The `<agent_returns>` block as segments: environment scaffolding, one expert each."""
    pieces = returns_pieces([(r.expert_id, r.result) for r in replies])
    segments = [environment(policy, pieces[0])]
    for reply, answer, scaffold in zip(replies, pieces[1::2], pieces[2::2], strict=True):
        segments.append(
            Segment(Author.EXPERT, answer, policy.encode_foreign(answer), None, reply.meta)
        )
        segments.append(environment(policy, scaffold))
    return segments


def _call_meta(
    query: ExpertQuery,
    outcome: str,
    accepted: bool,
    error: str | None = None,
    latency_s: float = 0.0,
    endpoint: str = "",
    truncated: bool = False,
) -> dict[str, Any]:
    """An expert segment's meta: the call, its outcome, whether ρ let it in, and whether
    the answer stopped at expert_max_tokens (cut mid-thought) rather than at its end."""
    return {
        "expert_id": query.expert_id,
        "query": query.query,
        "outcome": outcome,
        "accepted": accepted,
        "error": error,
        "latency_s": latency_s,
        "endpoint": endpoint,
        "truncated": truncated,
    }


def accepts(rng: random.Random, accept_prob: float) -> bool:
    """u ~ U(0, 1], accepted iff u <= ρ: ρ = 1 keeps every answer, ρ = 0 none."""
    return 1.0 - rng.random() <= accept_prob


def reply_from(
    query: ExpertQuery, record: CallRecord, rng: random.Random, accept_prob: float
) -> Reply:
    """The reply to a sent query; only an answer that came back draws u."""
    accepted = record.ok and accepts(rng, accept_prob)
    meta = _call_meta(
        query,
        record.outcome,
        accepted,
        error=record.error,
        latency_s=round(record.latency_s, 4),
        endpoint=record.endpoint,
        truncated=record.ok and record.finish_reason == "length",
    )
    return Reply(query.expert_id, record.text if accepted else None, meta)


def over_budget_reply(query: ExpertQuery) -> Reply:
    meta = _call_meta(query, "unavailable", False, error=QUERY_BUDGET_SPENT)
    return Reply(query.expert_id, None, meta)


# ----------------------------------------------------------------------------- episode views


# The blocks of the policy's own text that are not its answer: its queries to the experts,
# and returns it wrote itself (an engine that misses the stop string lets it invent them).
NOT_ANSWER_BLOCKS = (
    (AGENT_CALLS_OPEN, AGENT_CALLS_CLOSE),
    (AGENT_RETURNS_OPEN, AGENT_RETURNS_CLOSE),
)


def policy_text(episode: Episode) -> str:
    """Where the answer is read and the format checked: what the policy wrote, one
    segment per line, without its call blocks. The experts' "Answer:" lines are not in
    it (they are expert segments), nor one the policy put in a query ("Please verify.
    Answer: 42", never answered, would otherwise score F1 1)."""
    return "\n".join(
        strip_blocks(s.text, *NOT_ANSWER_BLOCKS)
        for s in episode.segments
        if s.author is Author.POLICY
    )


def summary(episode: Episode) -> dict[str, int]:
    """The per-episode counts the metrics read, derived from the segments."""
    calls = [c.meta for c in episode.calls]
    return {
        "expert_calls": len(calls),
        "expert_answers": sum(c["outcome"] != "unavailable" for c in calls),
        # Of those, the answers cut at expert_max_tokens (accepted by ρ or not).
        "expert_truncated": sum(bool(c.get("truncated")) for c in calls),
        "expert_failures": sum(c["outcome"] == "unavailable" for c in calls),
        "over_budget": sum(c["error"] == QUERY_BUDGET_SPENT for c in calls),
        "rejected": sum(c["outcome"] != "unavailable" and not c["accepted"] for c in calls),
        "format_errors": sum(len(s.meta.get("call_errors", ())) for s in episode.segments),
    }


def truncated_share(episodes: list[Episode]) -> float | None:
    """The share of the experts' answers in `episodes` that stopped at expert_max_tokens
    (a QwQ-style expert cut mid-thought); None when no answer came back. Over answers,
    not a mean of per-episode shares: an episode that asked once weighs one answer."""
    answers = sum(int(e.meta.get("expert_answers", 0)) for e in episodes)
    if not answers:
        return None
    return sum(int(e.meta.get("expert_truncated", 0)) for e in episodes) / answers


def episode_rng(task: Task, params: SamplingParams) -> random.Random:
    """The ρ draws of one episode: seeded from the run seed and the task, so runs repeat."""
    if params.seed is None:
        return random.Random()
    # A string seed is hashed with SHA-512, the same in every process (unlike hash()).
    return random.Random(f"{params.seed}/{task.problem_id}/{task.sample}")


# ----------------------------------------------------------------------------- the protocol


class ConsultProtocol:
    name = "consult"

    def __init__(
        self,
        policy: Policy,
        pool: ExpertPool | None,
        config: ConsultConfig,
        extract_fallback: tuple[str, ...] = (),
    ) -> None:
        config.check()
        policy.require_tokenizer(self.name)
        if config.mode == "open":
            if pool is None:
                raise UserError(
                    "the consult protocol in open mode needs an expert pool",
                    "pass --expert, or --set protocol.consult.mode=locked",
                )
            if pool.config.num_experts != config.num_experts:
                raise UserError(
                    f"the prompt offers {config.num_experts} experts but the pool has "
                    f"{pool.config.num_experts}",
                    "give consult.num_experts and the pool's num_experts the same K",
                )
        self.template = policy_template(config)
        self.policy = policy
        self.pool = pool
        self.config = config
        self.extract = self.template.extractors(extract_fallback)

    def run(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        episodes = new_episodes(self.policy, self.template, tasks, self.name)
        for episode in episodes:
            episode.meta.update(mode=self.config.mode, queries_sent=0)
            if self.config.mode == "open":
                episode.meta["accept_prob"] = self.config.accept_prob
        if self.config.mode == "open":
            self._run_open(episodes, tasks, params)
        else:
            self._run_locked(episodes, params)
        for episode in episodes:
            finish(episode, policy_text, self.extract)
            episode.meta.update(summary(episode))
        return episodes

    def _run_locked(self, episodes: list[Episode], params: SamplingParams) -> None:
        segments = policy_turn(self.policy, episodes, params, 0)
        for episode, segment in zip(episodes, segments, strict=True):
            episode.add(segment)
            episode.end = segment_end(segment)
            # Whether the evaluation prompt still draws out the trained calling habit.
            episode.meta["attempted_calls"] = AGENT_CALLS_OPEN in segment.text

    def _run_open(self, episodes: list[Episode], tasks: list[Task], params: SamplingParams) -> None:
        rngs = [episode_rng(t, params) for t in tasks]

        def after_policy(i: int, segment: Segment) -> ConsultTurn | None:
            return self._after_policy(episodes[i], segment, params)

        def serve(pauses: list[tuple[int, ConsultTurn]], round_no: int) -> list[int]:
            turns = [(episodes[i], turn, tasks[i].reference) for i, turn in pauses]
            answers = self._ask(turns, params, round_no)
            # Answers that cannot be written in fail their own episode (None), not the round.
            return [
                i
                for (i, turn), records in zip(pauses, answers, strict=True)
                if guard(episodes[i], self._answer, episodes[i], turn, records, rngs[i], params)
            ]

        run_rounds(self.policy, episodes, params, (AGENT_CALLS_CLOSE,), after_policy, serve)

    def _after_policy(
        self, episode: Episode, segment: Segment, params: SamplingParams
    ) -> ConsultTurn | None:
        """Read the segment's calls; the turn to answer, or None (end set) when it is over."""
        left = self.config.query_budget - episode.meta["queries_sent"]
        turn = consult_turn(
            segment.text, segment.meta.get("stop_reason"), self.config.num_experts, left
        )
        if turn.errors:
            segment.meta["call_errors"] = list(turn.errors)
        if not turn.called:
            episode.end = segment_end(segment)
            return None
        if remaining(episode, params) <= 0:
            episode.end = EndReason.LENGTH
        elif episode.turns >= self.config.turn_budget:
            # No turn left to read the answers: they are not asked for.
            episode.end = EndReason.TURN_BUDGET
        else:
            return turn
        segment.meta["unanswered"] = str(episode.end)
        return None

    def _ask(
        self,
        turns: list[tuple[Episode, ConsultTurn, Reference | None]],
        params: SamplingParams,
        round_no: int,
    ) -> list[list[CallRecord]]:
        """Every query of the round in one pool call; the records split back per turn.

        Each turn comes with its task's reference, which only the `reference` stand-in
        reads. Every query is sampled with its own seed (its episode's, round's and
        place's in the turn): K experts asked alike must not answer alike.
        """
        calls = [
            (q.expert_id, expert_messages(q.query), reference)
            for _, turn, reference in turns
            for q in turn.queries
        ]
        if not calls:
            return [[] for _ in turns]
        assert self.pool is not None  # open mode always has one
        seeds = tuple(
            seed
            for episode, turn, _ in turns
            for seed in collaborator_seeds(params, episode, round_no, len(turn.queries))
        )
        expert = collaborator_params(
            seeds,
            [self.config.expert_max_tokens] * len(calls),
            self.config.expert_temperature,
            self.config.expert_top_p,
        )
        records = self.pool.ask_sync(calls, expert)
        out: list[list[CallRecord]] = []
        for _, turn, _ in turns:
            out.append(records[: len(turn.queries)])
            records = records[len(turn.queries) :]
        return out

    def _answer(
        self,
        episode: Episode,
        turn: ConsultTurn,
        records: list[CallRecord],
        rng: random.Random,
        params: SamplingParams,
    ) -> bool:
        """Append the returns block; False when the episode ends instead."""
        episode.meta["queries_sent"] += len(turn.queries)
        replies = [
            reply_from(q, r, rng, self.config.accept_prob)
            for q, r in zip(turn.queries, records, strict=True)
        ]
        replies += [over_budget_reply(q) for q in turn.over_budget]
        segments = returns_segments(self.policy, replies)
        return append_if_room(episode, segments, params)

    def close(self) -> None:
        self.policy.close()
        if self.pool is not None:
            self.pool.close()


# -- the spec --------------------------------------------------------------------------

EXPERTS = Collaborator(
    "experts", key="experts", flag="--expert", served=True, many=True, author=Author.EXPERT
)


def build_consult(ctx: BuildContext) -> ConsultProtocol:
    config = ctx.config
    pool = None
    if config.consult.mode == "open":
        experts = [ctx.model] if config.consult.self_collab else config.experts
        pool = collaborator_pool(
            experts,
            config.consult.expert_timeout,
            collaborator_engine(ctx.engine, config.chat_template_kwargs),
            num_experts=config.consult.num_experts,
            tokenizer=ctx.policy.tokenizer,  # the `reference` stand-in counts policy tokens
        )
    return ConsultProtocol(ctx.policy, pool, config.consult, ctx.extract_fallback)


def check_consult(config: ProtocolConfig) -> None:
    has_experts = bool(config.experts) or config.consult.self_collab
    if config.consult.mode == "open" and not has_experts:
        raise MissingInput(
            "the consult protocol needs experts",
            "pass --expert MODEL_OR_URL, --self-collab, or --set protocol.consult.mode=locked",
        )


def consult_uses_reference(config: ProtocolConfig) -> bool:
    if config.consult.mode != "open":
        return False
    return not config.consult.self_collab and any(map(is_stand_in, config.experts))


def consult_extras(episode: Episode) -> dict[str, Any]:
    """In open mode, the acceptance probability this step's schedule set (EAPO's ρ_s) and
    whether the episode consulted: 1 when it sent at least one query to the experts, so
    that a step's mean is EAPO's Figure 4 consultation rate, a share of episodes in [0, 1]
    (`calls` counts queries, up to K a turn, and its mean can exceed 1). A query counts
    whether or not ρ_s let its answer in: the policy chose to ask; one the turn budget or
    the token budget left unsent does not."""
    if "accept_prob" not in episode.meta:
        return {}
    return {
        "accept_prob": episode.meta["accept_prob"],
        "consult_rate": float(episode.meta["queries_sent"] > 0),
    }


SPEC = ProtocolSpec(
    name="consult",
    help="EAPO, the policy consults a panel of K experts (--expert or --self-collab)",
    build=build_consult,
    section="consult",
    prompt=PolicyPrompt.OWN,
    template=lambda config: policy_template(config.consult),
    collaborators=(EXPERTS,),
    flags=(
        Flag("consult.self_collab", ("--self-collab",)),
        Flag("consult.expert_max_tokens", ("--expert-max-tokens",)),
    ),
    check=check_consult,
    uses_reference=consult_uses_reference,
    call_syntax="<agent_calls>",
    calls=lambda config: config.consult.mode == "open",
    episode_extras=consult_extras,
    # expert_truncated: the step's share of expert answers cut at expert_max_tokens, put
    # beside every episode by the training rollout (`train/rollout.py`).
    metric_keys=("accept_prob", "consult_rate", "expert_truncated"),
    grpo=False,
)
