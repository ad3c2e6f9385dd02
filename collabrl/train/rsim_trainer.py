"""`RSIMTrainer`: TRL's GRPOTrainer, taught that a second policy — the planner — acts.

TRL trains the reasoner exactly as it trains any GRPO policy (its rollout is the
`strategy` protocol, its loss masks the guidance tokens through `env_mask`). Six
overrides add the planner (`collabrl.train.rsim` has the rules):

- `create_optimizer`: the planner's parameters become one more AdamW group (its own
  learning rate), so the scheduler, the checkpointed optimizer state and resume cover it;
- `create_scheduler`: under joint training, λ enters the schedule of every group — the
  planner's rate × λ, the reasoner's × (1 − λ), at each step — so the stage switch acts
  under AdamW, and a resumed run recomputes the same rates from the restored step;
- `_generate_and_score_completions`: after TRL scores the batch, the planner's rewards
  are gathered from every process, made group-relative, and the planner's decisions
  (contexts, actions, sampling log-probs, guided token counts) join the batch as lists,
  which TRL shuffles and splits together with the tensors;
- `_compute_loss`: the planner's PPO-clip loss (weighed per token as in §4) + TRL's
  reasoner loss, unweighted: λ is in the learning rates. The planner's decisions go
  through it `rsim.planner_chunk` at a time, forward and backward, so its activations
  peak at one chunk's; its layers are checkpointed where the reasoner's are;
- `_clip_grad_norm`: one norm over both policies' gradients, clipped together;
- `_save_checkpoint`: the planner (backbone and head) into every checkpoint's
  `planner/`, which a resumed run loads.

The planner is prepared through accelerate, so under DDP its gradients are
all-reduced like the reasoner's; its forward pass runs through that wrapper. DeepSpeed
and FSDP shard the one model they wrap, so they are refused.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from collabrl.errors import UserError
from collabrl.protocols.planner import RSIMPlanner
from collabrl.rewards.rsim import group_advantages, planner_reward
from collabrl.strategies import STRATEGY_NAMES
from collabrl.train.rsim import (
    PLANNER_DIR,
    PlannerBatch,
    agent_lr_factors,
    end_shares,
    planner_batch,
    planner_clip_loss,
    planner_steps,
    planner_weight,
    without_failed,
)
from collabrl.train.rsim_config import RSIMConfig


class RSIMTrainer(GRPOTrainer):
    """GRPO for the reasoner and PPO-clip for the planner, their rates scaled by λ."""

    def __init__(self, *args: Any, planner: RSIMPlanner, rsim: RSIMConfig, **kwargs: Any) -> None:
        self.planner = planner
        self.rsim = rsim
        super().__init__(*args, **kwargs)
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            # Both shard the one model they wrap; the planner's parameters are not in it.
            raise UserError(
                "collab train rsim trains its planner beside the policy under DDP, not under "
                "DeepSpeed or FSDP",
                "launch with configs/accelerate/ddp.yaml",
            )
        # No dropout in either phase: the loss's first ratio is then exactly 1.
        planner.eval()
        planner.requires_grad_(self.trains_planner)
        if self.trains_planner:
            _freeze_unused_output_head(planner)
            if self.args.gradient_checkpointing:  # where the reasoner recomputes, so does it
                planner.checkpoint_layers(self.args.gradient_checkpointing_kwargs)
        if rsim.train == "planner":
            self.model.requires_grad_(False)  # the plug-in setting: a frozen reasoner
        self.planner_model = self.accelerator.prepare_model(planner)

    @property
    def trains_planner(self) -> bool:
        return self.rsim.train != "reasoner"

    def planner_weight(self) -> float:
        """λ of the step being trained (1-based), over the run's `max_steps`."""
        return planner_weight(self.state.global_step + 1, self.rsim, self.args.max_steps)

    # -- optimizer and clipping ------------------------------------------------------------

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        optimizer = super().create_optimizer(model)
        if self.trains_planner and not any(g.get("planner") for g in optimizer.param_groups):
            optimizer.add_param_group(
                {
                    "params": [p for p in self.planner.parameters() if p.requires_grad],
                    "lr": self.rsim.planner_learning_rate or self.args.learning_rate,
                    "weight_decay": self.args.weight_decay,
                    "planner": True,
                }
            )
        return optimizer

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> Any:
        created = self.lr_scheduler is None
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if created and self.rsim.train == "joint":
            self._scale_rates_by_lambda(scheduler)
        return scheduler

    def _scale_rates_by_lambda(self, scheduler: Any) -> None:
        """Multiply each group's schedule by its agent's λ factor. The factor is a pure
        function of the step, so it needs no state of its own: a resumed run restores
        the scheduler's step and recomputes the same rates."""
        if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            raise UserError(
                f"rsim scales the learning rates by λ, which the {self.args.lr_scheduler_type} "
                "schedule does not allow",
                "use a LambdaLR schedule (linear, cosine, constant, …) or --train planner|reasoner",
            )
        groups = scheduler.optimizer.param_groups
        scheduler.lr_lambdas = [
            self._lambda_scaled(schedule, planner=bool(group.get("planner")))
            for schedule, group in zip(scheduler.lr_lambdas, groups, strict=True)
        ]
        # LambdaLR already set the rates of step 1, without λ: set them again.
        done = scheduler.last_epoch
        schedules = zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
        rates = [base * schedule(done) for base, schedule in schedules]
        for group, rate in zip(groups, rates, strict=True):
            group["lr"] = rate
        scheduler._last_lr = rates

    def _lambda_scaled(self, schedule: Any, planner: bool) -> Any:
        """`schedule` (steps done → multiplier) times the agent's λ factor for the next
        step. A plain function, so LambdaLR's checkpoint leaves it out (it is rebuilt)."""

        def scaled(done: int) -> float:
            factors = agent_lr_factors(done + 1, self.rsim, self.args.max_steps)
            return schedule(done) * (factors.planner if planner else factors.reasoner)

        return scaled

    def _clip_grad_norm(self, model: Any) -> Any:
        """Clip the reasoner's and the planner's gradients as one vector."""
        params = itertools.chain(model.parameters(), self.planner.parameters())
        return self.accelerator.clip_grad_norm_(params, self.args.max_grad_norm)

    # -- the batch -----------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        rollout = self.rollout_func.last  # this process's episodes, in the batch's order
        steps = [planner_steps(e) for e in rollout.episodes]
        rewards = [
            planner_reward(bool(correct), strategies)
            for correct, strategies in zip(
                rollout.output["correct"], rollout.output["strategies"], strict=True
            )
        ]
        device = self.accelerator.device
        local = torch.tensor(
            [[r.total, r.accuracy, r.terminal, r.penalty] for r in rewards], device=device
        )
        everyone = self.accelerator.gather(local)  # processes in order: TRL's group layout
        advantages = group_advantages(everyone[:, 0].tolist(), self.num_generations)
        start = self.accelerator.process_index * len(rewards)
        own = without_failed(advantages[start : start + len(rewards)], rollout.episodes)
        output["planner_advantages"] = torch.tensor(own, device=device)
        output["planner_contexts"] = [s.contexts for s in steps]
        output["planner_actions"] = [s.actions for s in steps]
        output["planner_old_logps"] = [s.old_logps for s in steps]
        output["planner_tokens"] = [s.tokens for s in steps]
        self._log_planner_batch(everyone, rollout.output)
        return output

    def _log_planner_batch(self, rewards: torch.Tensor, extras: dict[str, list[Any]]) -> None:
        """The planner's rewards, its choices, and why the episodes ended, over every
        process's episodes."""
        metrics = self._metrics["train"]
        for column, name in enumerate(("reward", "accuracy", "terminal", "penalty")):
            metrics[f"planner/{name}"].append(rewards[:, column].mean().item())
        from accelerate.utils import gather_object

        chosen = [name for row in gather_object(list(extras["strategies"])) for name in row]
        metrics["planner/strategies_per_episode"].append(len(chosen) / len(rewards))
        for name in STRATEGY_NAMES:
            share = chosen.count(name) / len(chosen) if chosen else 0.0
            metrics[f"strategies/{name}"].append(share)
        for reason, share in end_shares(gather_object(list(extras["end"]))).items():
            metrics[f"planner/end_{reason}"].append(share)
        continued = gather_object(list(extras["eos_continued"]))
        metrics["planner/eos_continued"].append(sum(continued) / len(continued))

    # -- the loss ------------------------------------------------------------------------------

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """The two agents' losses, summed unweighted: λ scales their learning rates
        (`create_scheduler`), where AdamW cannot undo it, so it is not applied twice."""
        metrics = self._metrics["train"]
        metrics["planner/lambda"].append(self.planner_weight())
        for group in self.optimizer.param_groups if self.optimizer is not None else []:
            if group.get("planner"):
                metrics["planner/learning_rate"].append(float(group["lr"]))
        loss = None
        if self.rsim.train != "planner":
            loss = super()._compute_loss(model, inputs)
        if self.trains_planner:
            planner_loss = self._planner_loss(inputs)
            loss = planner_loss if loss is None else loss + planner_loss
        return loss

    def _planner_loss(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The planner's PPO-clip loss over every decision in the micro-batch, each
        weighed by the reasoner tokens it guided, averaged per sample (§4's equation).

        A micro-batch holds up to 16 samples × 12 decisions at paper scale, each a
        context of hundreds of tokens: they go through the planner `rsim.planner_chunk`
        at a time, forward and backward, so its activations peak at one chunk's while
        the gradients accumulate. The last chunk's loss keeps its graph for TRL's
        backward; the earlier ones run under DDP's no_sync, so the planner's gradients
        are all-reduced once per micro-batch on every process, however many chunks each
        process has. The value returned is the whole loss (the earlier chunks detached).
        """
        chunks = planner_batch(inputs).chunks(self.rsim.planner_chunk)
        scale = self.current_gradient_accumulation_steps
        done: list[_ChunkLoss] = []
        with self.accelerator.no_sync(self.planner_model):
            for chunk in chunks[:-1]:
                part = self._planner_chunk_loss(chunk)
                self.accelerator.backward(part.loss / scale)
                done.append(part.detached())
        last = self._planner_chunk_loss(chunks[-1])
        parts = [*done, last]
        decisions = sum(len(chunk.actions) for chunk in chunks)
        metrics = self._metrics["train"]
        metrics["planner/loss"].append(sum(p.loss.item() for p in parts))
        metrics["planner/clip_ratio"].append(sum(p.clipped for p in parts) / decisions)
        metrics["planner/entropy"].append(sum(p.entropy for p in parts) / decisions)
        earlier = sum((p.loss for p in done), torch.zeros((), device=last.loss.device))
        return (last.loss + earlier) / scale

    def _planner_chunk_loss(self, chunk: PlannerBatch) -> _ChunkLoss:
        """One chunk's share of the planner loss (its weights are fractions of the whole
        micro-batch's), with the chunk's clipped decisions and summed entropy."""
        ids, mask = self.planner.encode(chunk.contexts)
        logits = self.planner_model(ids, mask)
        new = self.planner.action_log_probs(logits, chunk.actions)
        device = new.device
        loss, clipped = planner_clip_loss(
            new,
            torch.tensor(chunk.old_logps, device=device),
            torch.tensor(chunk.advantages, device=device),
            self.epsilon_low,
            self.epsilon_high,
            torch.tensor(chunk.weights, device=device, dtype=new.dtype),
        )
        probs = self.planner.policy_log_probs(logits.detach()).exp()
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1).sum()
        size = len(chunk.actions)
        return _ChunkLoss(loss, clipped.item() * size, entropy.item())

    # -- checkpoints -------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            path = Path(self._get_output_dir(trial=trial)) / folder / PLANNER_DIR
            self.planner.save(path, with_backbone=True)

    def save_planner(self, folder: Path) -> None:
        """The trained planner as a folder `--planner` loads, written aside and renamed
        into place (main process only): a kill while saving leaves no half planner."""
        if not self.is_world_process_zero():
            return
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.planner.save(tmp, with_backbone=True)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)


@dataclass(frozen=True)
class _ChunkLoss:
    """A chunk's planner loss, the number of its decisions clipped, its summed entropy."""

    loss: torch.Tensor
    clipped: float
    entropy: float

    def detached(self) -> _ChunkLoss:
        """The same, its loss cut from the graph (its backward has run)."""
        return dataclasses.replace(self, loss=self.loss.detach())


def _freeze_unused_output_head(planner: RSIMPlanner) -> None:
    """The planner reads hidden states, never the LM head: an untied head gets no
    gradient, which DDP would wait for forever. A head tied to the embeddings trains."""
    head = planner.backbone.get_output_embeddings()
    embeddings = planner.backbone.get_input_embeddings()
    if head is not None and head.weight is not embeddings.weight:
        head.weight.requires_grad_(False)
