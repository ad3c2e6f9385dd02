"""`strategy` (rSIM): before every reasoning step a planner picks one of nine strategies.

The reasoner (the policy) writes its answer as steps separated by a blank line. Each
round, the planner sees the question and a short observation of every finished step
(`PlannerContext`; never the partial current step) and picks a strategy for every
running episode in one batched call; the strategy's guidance text is appended as a
guidance segment, and the reasoner continues all running episodes in one batched
generate until it writes "\\n\\n". Choosing `terminal` injects its guidance ("So the
final answer is") and the reasoner writes one last step, to its EOS. An episode also
ends after `max_steps` strategies or at the token budget, and, under `end: eos` only,
at the reasoner's EOS inside a step; `episode.end` says which. The paper reads both
ways (Algorithm 1 asks the planner until it picks Terminal, appendix A.7 also stops
at EOS): `StrategyConfig.end` picks one. Each guidance segment records the planner's
choice and, for the rsim planner, the chosen action's log-prob; the episode records the planner's
temperature and `summary_chars`, so a trainer rebuilds exactly the contexts and
probabilities of the rollout (`planner_contexts`).

Unlike the paper's masked reasoner context C_n^r, which drops past guidance, the
reasoner here keeps every guidance segment it was given: the trajectory is then one
token sequence, exactly what the reasoner was conditioned on, which GRPO can train on
with the guidance masked out of the loss. See docs/protocols/strategy.md for every
deviation from the paper and why.

The strategy set and its keyword counting live in `strategies.py`; the planners in
`planner.py`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from collabrl.data.prompts import PromptTemplate
from collabrl.engines import is_url
from collabrl.engines.base import SamplingParams
from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.errors import MissingInput, UserError
from collabrl.protocols.base import Policy, Task, policy_turn, remaining
from collabrl.protocols.collaborators import collaborator_engine
from collabrl.protocols.rounds import fail, finish, guard, new_episodes, segment_end
from collabrl.protocols.seeds import PLANNER_STREAM, episode_seeds
from collabrl.protocols.spec import BuildContext, Collaborator, Flag, PolicyPrompt, ProtocolSpec
from collabrl.protocols.strategies import PlannerContext, observe_step
from collabrl.protocols.strategy_config import StrategyConfig
from collabrl.rewards.rsim import follow_share, format_reward
from collabrl.strategies import (
    STEP_DELIMITER,
    STRATEGIES,
    TERMINAL,
    count_strategies,
)

if TYPE_CHECKING:  # the planners bring in torch: not needed to check a config
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.protocols.planner import Planner, PlannerChoice


def reasoner_steps(episode: Episode) -> list[str]:
    """The reasoner's own text of every step: one policy segment per step."""
    return [s.text for s in episode.segments if s.author is Author.POLICY]


def reasoner_text(episode: Episode) -> str:
    """Where the answer is read: the reasoner's steps, without the guidance."""
    return "".join(reasoner_steps(episode))


def planner_contexts(episode: Episode) -> list[PlannerContext]:
    """The context the planner saw before each of its choices, in order (for training):
    rebuilt with the episode's own `summary_chars`, so it is exactly what was sampled on."""
    summary_chars = episode.meta["summary_chars"]
    contexts: list[PlannerContext] = []
    steps: list[str] = []
    for segment in episode.segments:
        if segment.author is Author.GUIDANCE:
            contexts.append(PlannerContext(episode.meta["question"], tuple(steps)))
        elif segment.author is Author.POLICY:
            steps.append(observe_step(segment.text, summary_chars))
    return contexts


def guided_steps(episode: Episode) -> list[tuple[str, str]]:
    """(strategy, the reasoner's text of the step it guided) for every guided step."""
    pairs: list[tuple[str, str]] = []
    strategy = None
    for segment in episode.segments:
        if segment.author is Author.GUIDANCE:
            strategy = str(segment.meta["strategy"])
        elif segment.author is Author.POLICY and strategy is not None:
            pairs.append((strategy, segment.text))
            strategy = None
    return pairs


def strategy_extras(episode: Episode) -> dict[str, object]:
    """What the rSIM rewards and logs read of a `strategy` episode besides its
    correctness (its end reason is the common extras' `end`): the strategy spec's
    episode extras (its SPEC below)."""
    text = "".join(s.text for s in episode.segments if s.author is Author.POLICY)
    return {
        "strategies": list(episode.meta.get("strategies", [])),
        "follow": follow_share(guided_steps(episode)),
        "step_format": format_reward(text),
        # end: terminal: how many times the reasoner's EOS was overridden.
        "eos_continued": int(episode.meta.get("eos_continued", 0)),
    }


# -- prompts ---------------------------------------------------------------------------

STEP_PROMPT = PromptTemplate(
    name="strategy",
    system=(
        "Solve the problem step by step. Write each step as one short paragraph and "
        "separate the steps with a blank line. Put your final answer within \\boxed{}."
    ),
    user="{problem}",
    extract=("boxed", "answer_line"),
    source="collabrl: rSIM's '\\n\\n'-separated steps (appendix A.1) asked for by prompt",
)

# Plan-and-Solve+ (Wang et al., ACL 2023), trigger sentence of the authors' repository
# (AGI-Edgerunners/Plan-and-Solve-Prompting, prompt 302), after the problem in the user
# turn; the \boxed{} instruction replaces PS's second, answer-extraction prompt.
PS_PLUS_TRIGGER = (
    "Let's first understand the problem, extract relevant variables and their corresponding "
    "numerals, and devise a complete plan. Then, let's carry out the plan, calculate "
    "intermediate variables (pay attention to correct numerical calculation and commonsense), "
    "solve the problem step by step, and show the answer."
)
PS_PLUS_PROMPT = PromptTemplate(
    name="ps+",
    system="Put your final answer within \\boxed{}.",
    user="{problem}\n\n" + PS_PLUS_TRIGGER,
    extract=("boxed", "answer_line"),
    source="Plan-and-Solve+ prompting (Wang et al., 2023), the rSIM PS+ baseline",
)

# -- the protocol ----------------------------------------------------------------------

# What an rsim planner context holds besides the question and the observed steps
# (`planner_text`): "Question: " and "\nNext strategy:", and "\nStep 12: " before each
# step, in tokens, rounded up.
FRAME_TOKENS, STEP_LABEL_TOKENS = 8, 6
# Characters per planner token in an observed step, rounded down: BPE averages about 4 on
# English prose, 1.8 on a LaTeX-dense maths step (SmolLM2's tokenizer, which splits
# digits one by one as Qwen2.5's does). f_obs cuts a step to characters, so this turns
# summary_chars into tokens.
CHARS_PER_TOKEN = 1.5


def planner_context_tokens(config: StrategyConfig, question_tokens: int) -> int:
    """About the most tokens an rsim planner context holds: the question and, before
    the last decision, max_steps − 1 observed steps, each cut to summary_chars
    characters (whole steps, up to step_max_tokens, with summary_chars 0). For the
    memory estimate of a dry run, not a limit the rollout enforces."""
    step = config.step_max_tokens
    if config.summary_chars:
        step = min(step, math.ceil(config.summary_chars / CHARS_PER_TOKEN))
    return FRAME_TOKENS + question_tokens + (config.max_steps - 1) * (step + STEP_LABEL_TOKENS)


def policy_template(config: StrategyConfig) -> PromptTemplate:
    """The prompt the reasoner answers in: the step prompt under a planner, PS+ alone."""
    return PS_PLUS_PROMPT if config.planner_kind == "ps+" else STEP_PROMPT


class StrategyProtocol:
    name = "strategy"

    def __init__(
        self,
        policy: Policy,
        planner: Planner | None,
        config: StrategyConfig,
        extract_fallback: tuple[str, ...] = (),
    ) -> None:
        config.check()
        if (planner is None) != (config.planner_kind == "ps+"):
            raise UserError(
                f"planner kind {config.planner_kind} "
                + ("takes no planner" if planner is not None else "needs a planner"),
                "pass --planner MODEL_OR_URL, or --planner-kind ps+ without one",
            )
        self.template = policy_template(config)  # the check above: ps+ has no planner
        if planner is not None:
            policy.require_tokenizer(self.name)  # guidance is appended in policy ids
        self.policy = policy
        self.planner = planner
        self.config = config
        self.extract = (*self.template.extract, *extract_fallback)

    def run(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        if self.planner is None:
            episodes = self._run_ps_plus(tasks, params)
        else:
            episodes = self._run_planned(tasks, params, self.planner)
        for episode in episodes:
            finish(episode, reasoner_text, self.extract)  # guidance is not the reasoner's
            # Joined by the delimiter: a step cut by its token limit is still a step.
            steps = STEP_DELIMITER.join(reasoner_steps(episode))
            episode.meta["strategy_counts"] = count_strategies(steps)
        return episodes

    def _run_ps_plus(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        """The PS+ baseline: one response to the PS+ prompt, exactly like `solo`."""
        from collabrl.protocols.solo import SoloProtocol

        episodes = SoloProtocol(self.policy, self.template, self.extract).run(tasks, params)
        for episode in episodes:
            episode.meta.update(protocol=self.name, planner="ps+", strategies=[])
        return episodes

    def _run_planned(
        self, tasks: list[Task], params: SamplingParams, planner: Planner
    ) -> list[Episode]:
        episodes = new_episodes(self.policy, self.template, tasks, self.name)
        for episode in episodes:
            episode.meta.update(
                planner=self.config.planner_kind,
                planner_temperature=self.config.planner_temperature,
                summary_chars=self.config.summary_chars,
                end_mode=self.config.end,
                eos_continued=0,  # end: terminal: reasoner EOSes the planner overrode
                strategies=[],
            )
        final: list[Episode] = []  # chose terminal: their last step is written after the loop
        for round_no in range(self.config.max_steps):
            running = [e for e in episodes if e.end is None]
            if not running:
                break
            contexts = [PlannerContext(e.meta["question"], self._observations(e)) for e in running]
            # Each decision seeded by its own episode (problem, sample, round), as every
            # other stream is: a seed per batch drew the same strategies on every process
            # (their first contexts are alike) and moved with an episode's batch position.
            seeds = episode_seeds(params, running, round_no, PLANNER_STREAM)
            try:
                choices = planner.choose(contexts, seeds=seeds)
            except Exception as error:  # one batched choice: its episodes fail, not the run
                for episode in running:
                    fail(episode, error)
                continue
            stepping = []
            for episode, choice in zip(running, choices, strict=True):
                if not guard(episode, self._inject, episode, choice, params):
                    continue
                if choice.index == TERMINAL:
                    episode.end = EndReason.TERMINAL
                    final.append(episode)
                else:
                    stepping.append(episode)
            self._write(stepping, params, round_no, stop=(STEP_DELIMITER,))
        for episode in episodes:
            if episode.end is None:
                episode.end = EndReason.MAX_STEPS
        # One batched call for every terminal step, without the step stop: the reasoner
        # concludes (to its EOS or the step limit) whatever the episode's end says.
        self._write(final, params, self.config.max_steps, stop=())
        return episodes

    def _observations(self, episode: Episode) -> tuple[str, ...]:
        return tuple(observe_step(s, self.config.summary_chars) for s in reasoner_steps(episode))

    def _inject(self, episode: Episode, choice: PlannerChoice, params: SamplingParams) -> bool:
        """Append the chosen strategy's guidance; False (and the episode ends) if no room."""
        strategy = STRATEGIES[choice.index]
        # A step cut by its token limit did not end in a blank line: start a new one.
        written = episode.response_text
        newlines = len(written) - len(written.rstrip("\n"))
        separator = "" if not written else "\n" * max(0, 2 - newlines)
        text = separator + strategy.guidance
        ids = self.policy.encode_foreign(text)
        if len(ids) >= remaining(episode, params):  # the reasoner must get a token too
            episode.end = EndReason.LENGTH
            return False
        meta: dict[str, object] = {"strategy": strategy.name, "index": choice.index}
        if choice.probs is not None:
            meta["probs"] = list(choice.probs)
        if choice.logprob is not None:
            meta["logprob"] = choice.logprob
        if choice.reply is not None:
            meta["reply"] = choice.reply
        if choice.error is not None:
            meta["error"] = choice.error
        episode.add(Segment(Author.GUIDANCE, text, ids, None, meta))
        episode.meta["strategies"].append(strategy.name)
        return True

    def _write(
        self, episodes: list[Episode], params: SamplingParams, round_no: int, stop: tuple[str, ...]
    ) -> None:
        """One reasoner step for every episode, in one batched call."""
        limit = self.config.step_max_tokens
        segments = policy_turn(
            self.policy, episodes, params, round_no, limit, stop=stop, include_stop=bool(stop)
        )
        for episode, segment in zip(episodes, segments, strict=True):
            if episode.end is not None:
                episode.add(segment)
                continue  # a terminal step: the episode already ended by the planner's choice
            if segment.meta["stop_reason"] is None and segment_end(segment) is EndReason.EOS:
                if self.config.end == "eos":
                    episode.end = EndReason.EOS
                else:
                    # Algorithm 1: only the planner ends the episode. The EOS token goes, so
                    # the reasoner is never conditioned on an EOS mid-answer; the next
                    # guidance opens a new paragraph after the step's text.
                    self._drop_eos(segment)
                    episode.meta["eos_continued"] += 1
            episode.add(segment)
            if episode.end is None and remaining(episode, params) <= 0:
                episode.end = EndReason.LENGTH

    def _drop_eos(self, segment: Segment) -> None:
        """Remove the EOS token a step ended on (its text, decoded without special
        tokens, is unchanged); a segment whose last id is not special is left as is."""
        tokenizer = self.policy.tokenizer
        ids = segment.token_ids
        if not ids or tokenizer is None or ids[-1] not in tokenizer.all_special_ids:
            return
        segment.token_ids = ids[:-1]
        if segment.logprobs is not None:
            segment.logprobs = segment.logprobs[:-1]
        segment.meta["eos_dropped"] = True

    def close(self) -> None:
        self.policy.close()
        if self.planner is not None:
            self.planner.close()


# -- the spec --------------------------------------------------------------------------

# In-process under the rsim planner (a folder or backbone trained beside the policy),
# served only when prompted (a model reference or base URL, as a teacher is).
PLANNER = Collaborator(
    "planner",
    key="planner",
    flag="--planner",
    served=True,
    author=Author.GUIDANCE,
    served_when=lambda config: config.strategy.planner_kind == "prompting",
)


def build_strategy(ctx: BuildContext) -> StrategyProtocol:
    from collabrl.protocols.planner import load_planner  # torch: not to check a config

    config, strategy = ctx.config, ctx.config.strategy
    planner = None
    if strategy.planner_kind != "ps+":
        planner = load_planner(
            config.planner,
            strategy.planner_kind,
            strategy.planner_temperature,
            strategy.head_seed,
            collaborator_engine(ctx.engine, config.chat_template_kwargs),
            strategy.masked_indices(),
        )
    return StrategyProtocol(ctx.policy, planner, strategy, ctx.extract_fallback)


def check_strategy(config: ProtocolConfig) -> None:
    if config.strategy.planner_kind == "ps+":
        return
    if not config.planner:
        raise MissingInput("the strategy protocol needs a planner", "pass --planner MODEL_OR_URL")
    if config.strategy.planner_kind == "rsim" and is_url(config.planner):
        raise UserError(
            f"an rsim planner runs in-process and cannot be reached at {config.planner}",
            "pass a planner folder or a model reference, or --planner-kind prompting",
        )


SPEC = ProtocolSpec(
    name="strategy",
    help="rSIM, a planner (--planner) injects a reasoning strategy before every step",
    build=build_strategy,
    section="strategy",
    prompt=PolicyPrompt.OWN,
    template=lambda config: policy_template(config.strategy),
    collaborators=(PLANNER,),
    flags=(Flag("strategy.planner_kind", ("--planner-kind",)),),
    check=check_strategy,
    episode_extras=strategy_extras,
    grpo=False,
)


__all__ = [
    "PS_PLUS_PROMPT",
    "STEP_PROMPT",
    "StrategyConfig",
    "StrategyProtocol",
    "planner_context_tokens",
    "policy_template",
    "planner_contexts",
    "reasoner_steps",
]
