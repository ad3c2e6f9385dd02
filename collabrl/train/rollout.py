"""A protocol as TRL's `rollout_func`: the Episodes a GRPO step learns from.

The protocol that serves `collab infer` and `collab eval` runs unchanged; this module
only translates. TRL hands the rollout the prompts of this process's batch (each
prompt repeated once per sample of its group, by TRL's sampler), and gets back, per
sample, the Episode's own ids and masks:

    prompt_ids      the prompt as the policy saw it
    completion_ids  every response token, whoever wrote it (the policy's context; a
                    segment relay's `rollback` took out of it is not there)
    env_mask        1 on tokens the policy sampled, 0 on teacher/expert/environment text
                    (`Episode.loss_mask`)
    logprobs        the policy's sampling log-probs, 0.0 on tokens it did not sample
                    (`Episode.response_logprobs`)
    + extras        answer, correctness, F1, call ratios, calls, end reason, …

so the loss (TRL's `loss_mask = completion_mask * env_mask`) never touches a token
the policy did not write, and rewards read the Episode's own answer rather than
TRL's decoding of the completion (which holds teacher text and call commands). The one
exception is a protocol's choice, recorded on the segment (`Segment.trained`): relay's
teacher under `relay.train_teacher_tokens` gets env_mask 1 and log-prob NaN, which TRL
reads as no sampling log-prob (its importance ratio 1).

The dataset's `prompt` column is the item id: the rollout looks the item up (its
problem, reference answer and solution), so tasks carry what a collaborator such as
the reference stand-in needs. In process, generation happens only inside TRL's
`unwrap_model_for_generation`: with gradient checkpointing on, a model used outside
it runs without its KV cache and silently writes garbage. With TRL's vLLM
(`use_vllm`), the policy engine is TRL's colocated `vllm.LLM` or its `trl vllm-serve`
server, whose weights TRL syncs before each rollout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl import runs
from collabrl.data.benchmarks import Item
from collabrl.engines.base import Engine, SamplingParams
from collabrl.engines.openai_http import OpenAIEngine
from collabrl.engines.vllm import VLLMEngine
from collabrl.episode import EndReason, Episode
from collabrl.protocols import registry
from collabrl.protocols.base import CollabProtocol, Task
from collabrl.protocols.consult import policy_text, truncated_share
from collabrl.rewards.eapo import format_ok
from collabrl.rewards.score import score_episode
from collabrl.train.episodes import check_trainable
from collabrl.train.schedules import ScheduleCallback

if TYPE_CHECKING:
    import torch
    from trl import GRPOTrainer

    from collabrl.engines.hf import TransformersEngine

log = logging.getLogger(__name__)


def episode_extras(episode: Episode, item: Item) -> dict[str, Any]:
    """What rewards and logs read from one Episode: scored on its own answer, then what
    its protocol's spec adds (consult's acceptance probability, rSIM's strategies …)."""
    spec = registry.find(episode.meta.get("protocol"))
    return {
        "problem_id": episode.problem_id,
        # A truncated episode's flexible answer (its last number) earns no reward.
        **score_episode(episode, item.answer, item.answer_type, training=True),
        "call_ratio": episode.call_ratio_realised(),
        "call_ratio_requested": episode.call_ratio_requested(),
        "calls": len(episode.calls),
        # Every author's tokens: what relay's per-call ρ divides by (train/rewards.py).
        "response_tokens": len(episode.response_ids),
        "accepted_calls": sum(1 for s in episode.calls if s.meta.get("accepted", True)),
        "format_errors": int(episode.meta.get("format_errors", 0)),
        "tool_calls": len(episode.tool_calls),
        "tool_errors": episode.tool_errors,
        "format_ok": format_ok(policy_text(episode)),
        "end": str(episode.end),
        **(spec.episode_extras(episode) if spec is not None else {}),
    }


def identical_group_share(episodes: list[Episode]) -> float | None:
    """The share of this batch's prompt groups whose samples are one token sequence
    (None: no problem has two samples here). Samples of a group that all agree get
    advantage 0 whatever the reward: a share of 1 means the step learns nothing, the
    mark of samples seeded alike (issue 22) or of a temperature that does not sample."""
    groups: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    for episode in episodes:
        groups[episode.problem_id].append(tuple(episode.response_ids))
    sampled = [texts for texts in groups.values() if len(texts) > 1]
    if not sampled:
        return None
    return sum(len(set(texts)) == 1 for texts in sampled) / len(sampled)


def warn_if_all_identical(share: float | None, step: int) -> None:
    """Say loudly, once per step, that no group has two different samples."""
    if share == 1.0:
        log.warning(
            "step %d: every prompt group's samples are identical, so every advantage is 0 "
            "and this step learns nothing; check that the rollout samples (temperature > 0) "
            "with a different seed per sample",
            step + 1,
        )


def schedule_generation(trainer: GRPOTrainer) -> None:
    """Tell the trainer's schedules (EAPO's ρ_s and turn budget) that a generation starts:
    TRL generates inside a training step, where no callback event fires, and the
    schedules count generations, not optimizer steps."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, ScheduleCallback):
            callback.on_generation(trainer.args, trainer.state, trainer._step)


@dataclass(frozen=True)
class RolloutBatch:
    """One call's episodes and what TRL got for them (ids, masks and extras, one list
    entry per episode), in the batch's order."""

    episodes: list[Episode]
    output: dict[str, list[Any]]


@dataclass(frozen=True)
class Scores:
    """What TRL made of one episode after the rollout: its reward (the weighted sum of the
    parts TRL logs as `reward`; None when every function left it out), each reward
    function's part by name (None where that function did not apply) and its advantage."""

    reward: float | None
    rewards: dict[str, float | None]
    advantage: float


class RolloutLog:
    """`rollouts.jsonl`: the first `keep` episodes of every step's rollout on the main
    process, each with its step, its extras (correct, call ratio, …), its reward, the
    reward's parts and its advantage, and every authored segment, so a run can be read
    back as transcripts (`collab view RUN`)."""

    def __init__(self, path: Path, keep: int) -> None:
        self.path, self.keep = path, keep

    def write(self, step: int, batch: RolloutBatch, scores: list[Scores]) -> None:
        with runs.RecordWriter(self.path) as writer:
            for i, episode in enumerate(batch.episodes[: self.keep]):
                shown = {key: batch.output[key][i] for key in LOGGED_EXTRAS if key in batch.output}
                scored = dataclasses.asdict(scores[i])
                writer.write({"step": step, **shown, **scored, "episode": episode.to_dict()})


# The extras a saved rollout keeps beside its episode.
LOGGED_EXTRAS = ("correct", "gold", "f1", "call_ratio", "calls", "tool_calls", "end")


def _number(value: float) -> float | None:
    """A reward as JSON holds it: TRL's NaN (a function that did not apply) as None."""
    return None if math.isnan(value) else value


def episode_scores(
    trainer: GRPOTrainer, rewards_per_func: torch.Tensor, advantages: torch.Tensor
) -> list[Scores]:
    """The scores of this process's episodes, in their order: `rewards_per_func` is TRL's
    (every process's rows, process by process: TRL gathers them to normalise per group),
    `advantages` this process's slice of TRL's advantages."""
    count = len(advantages)
    start = trainer.accelerator.process_index * count  # TRL's own `process_slice`
    own = rewards_per_func[start : start + count].float().cpu()
    weights = trainer.reward_weights.to(own.device)
    # TRL's sum: weighted, a function that did not apply (NaN) left out, and no reward at
    # all when none applied.
    totals = (own * weights).nansum(dim=1).tolist()
    unscorable = own.isnan().all(dim=1).tolist()
    scores = []
    for row, total, none, advantage in zip(
        own.tolist(), totals, unscorable, advantages.tolist(), strict=True
    ):
        parts = {name: _number(v) for name, v in zip(trainer.reward_func_names, row, strict=True)}
        scores.append(Scores(None if none else total, parts, advantage))
    return scores


def log_scored_rollouts(trainer: GRPOTrainer, rollout: ProtocolRollout) -> None:
    """Write the main process's kept episodes to `rollout.log` once TRL has scored them,
    with their reward, its parts and their advantage.

    TRL computes both after the rollout returns, inside `_generate_and_score_completions`,
    and hands them to no callback: the rewards come from `_calculate_rewards` (every
    process's rows), the advantages in the batch it returns (this process's rows, in the
    rollout's order: TRL shuffles only after). Wrapping the two methods on the instance,
    as `importance.watch_sequence_mask` does, serves `GRPOTrainer` and `RSIMTrainer` alike.
    """
    log = rollout.log
    if log is None or trainer.accelerator.process_index != 0:
        return  # the other processes still gather their rewards inside TRL
    calculate: Callable[..., torch.Tensor] = trainer._calculate_rewards
    score: Callable[[Any], dict[str, Any]] = trainer._generate_and_score_completions
    calculated: list[torch.Tensor] = []

    def calculate_rewards(*args: Any, **kwargs: Any) -> torch.Tensor:
        rewards = calculate(*args, **kwargs)
        calculated[:] = [rewards]
        return rewards

    def scored(inputs: Any) -> dict[str, Any]:
        # Cleared first, so that a batch scored without the rollout never gets logged
        # beside the episodes of the batch before it.
        calculated.clear()
        rollout.last = None
        batch = score(inputs)
        made = rollout.last
        if made is not None and calculated:
            scores = episode_scores(trainer, calculated[0], batch["advantages"])
            log.write(trainer.state.global_step + 1, made, scores)
        return batch

    trainer._calculate_rewards = calculate_rewards
    trainer._generate_and_score_completions = scored


class ProtocolRollout:
    """TRL's `rollout_func` over a protocol whose policy engine holds the live model.

    Collaborators (teacher, experts, planner) are built once with the protocol; each
    call re-binds the engine to the model TRL unwraps for generation.
    """

    def __init__(
        self,
        protocol: CollabProtocol,
        engine: TransformersEngine,
        items: list[Item],
        params: SamplingParams,
        num_generations: int,
        log: RolloutLog | None = None,
    ) -> None:
        self.protocol = protocol
        self.log = log
        self.engine = engine
        self.items = {item.id: item for item in items}
        self.params = dataclasses.replace(params, logprobs=True)
        self.num_generations = num_generations
        self._vllm: Engine | None = None  # TRL's vLLM, when the run generates with it
        # The last batch: a trainer that learns more than TRL does (rSIM's planner) reads it.
        self.last: RolloutBatch | None = None

    def tasks(self, prompts: list[str], offset: int) -> list[Task]:
        """One task per prompt; the sample index is the position in its group, counted
        over the whole batch (`offset`: this process's first position)."""
        out = []
        for i, item_id in enumerate(prompts):
            item = self.items[item_id]
            reference = item.reference
            sample = (offset + i) % self.num_generations
            out.append(Task(item.id, item.problem, sample, reference))
        return out

    def __call__(self, prompts: list[str], trainer: GRPOTrainer) -> dict[str, list[Any]]:
        offset = trainer.accelerator.process_index * len(prompts)
        tasks = self.tasks(prompts, offset)
        schedule_generation(trainer)
        params = dataclasses.replace(self.params, seed=self._step_seed(trainer))
        began = time.perf_counter()
        if trainer.use_vllm:
            # TRL has synced the trained weights into its vLLM before calling the rollout.
            self.protocol.policy.engine = self.vllm_engine(trainer)
            episodes = self.protocol.run(tasks, params)
        else:
            episodes = self._run_live(trainer, tasks, params)
        seconds = time.perf_counter() - began
        empty = check_trainable(episodes)  # refuses re-encoded ids
        out = self.to_trl(episodes)
        out["empty"] = [empty] * len(episodes)  # logged as episodes/empty
        # Logged as episodes/rollout_seconds: the generation share of TRL's step_time.
        out["rollout_seconds"] = [seconds] * len(episodes)
        share = identical_group_share(episodes)
        warn_if_all_identical(share, trainer.state.global_step)
        if share is not None:  # logged as episodes/identical_groups
            out["identical_groups"] = [share] * len(episodes)
        truncated = truncated_share(episodes)
        if truncated is not None:  # logged as episodes/expert_truncated
            out["expert_truncated"] = [truncated] * len(episodes)
        # Logged with its rewards and advantages once TRL has scored it (log_scored_rollouts).
        self.last = RolloutBatch(episodes, out)
        return out

    def _run_live(
        self, trainer: GRPOTrainer, tasks: list[Task], params: SamplingParams
    ) -> list[Episode]:
        """The protocol on the model being trained, in this process."""
        with self.live_engine(trainer):
            return self.protocol.run(tasks, params)

    @contextlib.contextmanager
    def live_engine(self, trainer: GRPOTrainer) -> Iterator[TransformersEngine]:
        """The policy engine over the model being trained, unwrapped as TRL unwraps it for
        generation (outside that, with gradient checkpointing on, the model runs without
        its KV cache and writes garbage)."""
        import torch
        from trl.models.utils import unwrap_model_for_generation

        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            self.engine.model = model
            self.engine.reset()  # the weights changed since the engine last ran
            yield self.engine

    def vllm_engine(self, trainer: GRPOTrainer) -> Engine:
        """The policy engine over TRL's vLLM (`--set trl.use_vllm=true`), built once:
        the colocated `vllm.LLM` of this process, or the `trl vllm-serve` server through
        its OpenAI-compatible API (token-id prompts, so the ids are the sampled ones)."""
        if self._vllm is None:
            args = trainer.args
            kwargs = self.engine.chat_template_kwargs
            if args.vllm_mode == "colocate":
                llm = trainer.vllm_generation.llm
                self._vllm = VLLMEngine.over(llm, self.engine.tokenizer, "vllm:colocate", kwargs)
            else:
                url = args.vllm_server_base_url or (
                    f"http://{args.vllm_server_host}:{args.vllm_server_port}"
                )
                self._vllm = OpenAIEngine(url, chat_template_kwargs=kwargs)
        return self._vllm

    def _step_seed(self, trainer: GRPOTrainer) -> int | None:
        if self.params.seed is None:
            return None
        return self.params.seed + 1009 * trainer.state.global_step

    def to_trl(self, episodes: list[Episode]) -> dict[str, list[Any]]:
        """TRL's rollout output for the episodes, in order."""
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "env_mask": [],
            "logprobs": [],
        }
        logprobs_complete = True
        for episode in episodes:
            ids, mask = episode.response_ids, episode.loss_mask()
            logprobs = episode.response_logprobs()
            if not ids:
                # TRL needs one token per completion; an empty episode trains on nothing.
                ids, mask, logprobs = [self._eos_id()], [0], [0.0]
            elif episode.end is EndReason.ERROR:
                # Masked, not trained with reward 0: it failed in the toolkit's code (a
                # tool, a collaborator or a parser raised, where the contract is that
                # none does), so its tokens were never judged, and a penalty would teach
                # the policy to avoid our bug, not its mistake. It keeps its place in the
                # group, with no answer and reward 0 (train/rewards.py), as EMPTY does.
                mask = [0] * len(ids)
            logprobs_complete = logprobs_complete and logprobs is not None
            out["prompt_ids"].append(list(episode.prompt_ids))
            out["completion_ids"].append(list(ids))
            out["env_mask"].append(mask)
            out["logprobs"].append(logprobs)
            for key, value in episode_extras(episode, self.items[episode.problem_id]).items():
                out.setdefault(key, []).append(value)
        if not logprobs_complete:
            out["logprobs"] = None  # TRL then recomputes what it needs
        return out

    def _eos_id(self) -> int:
        return int(self.engine.tokenizer.eos_token_id)
