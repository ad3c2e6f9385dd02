"""`RSIMTrainer` on the tiny random model as reasoner and planner backbone: a batch
carries the planner's decisions, λ scales the two agents' learning rates, clipping
covers both, guidance gets no reasoner gradient, and the planner is saved with every
checkpoint and resumed from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback, get_scheduler
from trl import GRPOTrainer

from collabrl.config import DecodingConfig
from collabrl.data.benchmarks import load_benchmark
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.planner import BACKBONE_DIR, HEAD_FILE, RSIMPlanner
from collabrl.protocols.strategies import PlannerContext
from collabrl.protocols.strategy import StrategyConfig
from collabrl.rewards.rsim import group_advantages, planner_reward
from collabrl.train.grpo import train_grpo
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.resolve import resolve_run
from collabrl.train.rsim import PLANNER_DIR, STRATEGY_PLOT
from collabrl.train.rsim_config import RSIMConfig
from collabrl.train.run import METRICS
from collabrl.train.trainer import build_trainer
from tests.saved_activations import SavedActivations
from tests.train.test_grpo import _config as grpo_config

CONTEXTS = [PlannerContext("What is 2+3?"), PlannerContext("What is 7*6?", ("7*6 is 42.",))]


def _config(model: Path, out: Path, **changes) -> GRPOTrainConfig:
    """test_grpo's small run, as rsim with the tiny model as planner backbone too."""
    protocol = ProtocolConfig(
        # end: eos lets episodes end early, so a group's planner rewards differ.
        planner=str(model),
        strategy=StrategyConfig(max_steps=3, step_max_tokens=8, end="eos"),
    )
    # A high rate: the tiny model must visibly move in one step.
    rsim = {
        "method": "rsim",
        "sampling": DecodingConfig(n=2, max_tokens=24, temperature=1.0),
        "learning_rate": 1e-3,
        "protocol": protocol,
    }
    return grpo_config(model, out, **(rsim | changes))


def _logits(folder: Path) -> torch.Tensor:
    with torch.no_grad():
        return RSIMPlanner.load(folder).logits(CONTEXTS)


@pytest.fixture(scope="module")
def batch(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """A trainer at step 1 and one scored batch of two groups of two."""
    config = _config(tiny_model_dir, tmp_path_factory.mktemp("rsim-batch"))
    bench = load_benchmark(config.data, limit=config.limit)
    trainer, protocol = build_trainer(resolve_run(config), bench, Path(config.out), None)
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop otherwise
    ids = [bench.items[0].id] * 2 + [bench.items[1].id] * 2
    inputs = trainer._generate_and_score_completions([{"prompt": i} for i in ids])
    yield trainer, inputs
    protocol.close()


def test_a_batch_carries_the_planner_decisions_and_group_advantages(batch) -> None:
    trainer, inputs = batch
    last = trainer.rollout_func.last
    rewards = [
        planner_reward(bool(c), s).total
        for c, s in zip(last.output["correct"], last.output["strategies"], strict=True)
    ]
    assert inputs["planner_advantages"].tolist() == pytest.approx(group_advantages(rewards, 2))
    for contexts, actions, old in zip(
        inputs["planner_contexts"],
        inputs["planner_actions"],
        inputs["planner_old_logps"],
        strict=True,
    ):
        assert len(contexts) == len(actions) == len(old) >= 1
        with torch.no_grad():  # the rollout's probabilities, recomputed with the trainer's
            again = trainer.planner.action_log_probs(trainer.planner.logits(contexts), actions)
        assert again.tolist() == pytest.approx(old, abs=1e-5)


def test_the_losses_add_up_and_clipping_covers_the_planner(batch) -> None:
    trainer, inputs = batch
    assert trainer.planner_weight() == 0.7  # step 1 of 2: the planner's stage
    inputs = with_advantages(inputs)
    reasoner = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
    planner = trainer._planner_loss(inputs)
    joint = trainer._compute_loss(trainer.model, inputs)
    # Unweighted: λ acts on the learning rates (next test), where AdamW cannot undo it.
    assert planner.item() != 0
    assert joint.item() == pytest.approx(reasoner.item() + planner.item(), abs=1e-6)

    trainer.model.zero_grad()
    trainer.planner.zero_grad()
    joint.backward()
    head = trainer.planner.head.weight.grad
    assert head is not None and head.abs().sum() > 0  # the planner learns from the loss

    def norm(params) -> float:
        return torch.sqrt(sum(p.grad.pow(2).sum() for p in params if p.grad is not None)).item()

    reasoner_norm = norm(trainer.model.parameters())
    planner_norm = norm(trainer.planner.parameters())
    trainer.args.max_grad_norm = 1e-3
    total = trainer._clip_grad_norm(trainer.model)
    assert float(total) == pytest.approx((reasoner_norm**2 + planner_norm**2) ** 0.5, rel=1e-4)
    after = [norm(trainer.model.parameters()), norm(trainer.planner.parameters())]
    clipped = (after[0] ** 2 + after[1] ** 2) ** 0.5
    assert clipped == pytest.approx(1e-3, rel=1e-3)  # both scaled by one factor
    trainer.model.zero_grad()
    trainer.planner.zero_grad()


def test_lambda_scales_each_agents_learning_rate_step_by_step(batch) -> None:
    trainer, _ = batch
    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    try:
        groups = trainer.optimizer.param_groups
        planner = [g for g in groups if g.get("planner")]
        reasoner = [g for g in groups if not g.get("planner")]
        assert planner and reasoner
        base = trainer.lr_scheduler.base_lrs
        rates = []
        for _ in range(trainer.args.max_steps):  # steps 1 and 2: λ 0.7, then 0.3
            rates.append(([g["lr"] for g in planner], [g["lr"] for g in reasoner]))
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
        # The run's own schedule without λ, over the same steps.
        plain = get_scheduler(
            trainer.args.lr_scheduler_type,
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
            num_warmup_steps=trainer.args.get_warmup_steps(trainer.args.max_steps),
            num_training_steps=trainer.args.max_steps,
        )
        factors = [plain.lr_lambdas[0](done) for done in range(trainer.args.max_steps)]
        planner_base = [b for b, g in zip(base, groups, strict=True) if g.get("planner")]
        reasoner_base = [b for b, g in zip(base, groups, strict=True) if not g.get("planner")]
        for step, weight in enumerate((0.7, 0.3)):
            got_planner, got_reasoner = rates[step]
            factor = factors[step]
            assert got_planner == pytest.approx([b * factor * weight for b in planner_base])
            assert got_reasoner == pytest.approx([b * factor * (1 - weight) for b in reasoner_base])
    finally:
        trainer.optimizer = trainer.lr_scheduler = None


def with_advantages(inputs: dict) -> dict:
    """The batch with reasoner advantages of ±1 and planner ones of 1 and −0.5 (a sum
    that is not 0, so the planner loss is not 0 at ratio 1): the tiny model's rewards
    are often all equal (advantages 0), which would hide every gradient the tests look at."""
    pairs = len(inputs["advantages"]) // 2
    signs = torch.tensor([1.0, -1.0]).repeat(pairs)
    planner = torch.tensor([1.0, -0.5]).repeat(pairs)
    return {
        **inputs,
        "advantages": signs.to(inputs["advantages"]),
        "planner_advantages": planner.to(inputs["planner_advantages"]),
    }


def _planner_gradients(trainer, inputs: dict, chunk: int) -> tuple[float, list[torch.Tensor]]:
    """The planner loss of `inputs` in chunks of `chunk` decisions, and the gradients it
    leaves on the planner once TRL's backward has run on what it returns."""
    trainer.rsim.planner_chunk = chunk
    trainer.planner.zero_grad()
    try:
        loss = trainer._planner_loss(inputs)
        loss.backward()
    finally:
        trainer.rsim.planner_chunk = RSIMConfig().planner_chunk
    grads = [p.grad.clone() for p in trainer.planner.parameters() if p.grad is not None]
    trainer.planner.zero_grad()
    return loss.item(), grads


def _decisions(inputs: dict) -> int:
    return sum(len(row) for row in inputs["planner_actions"])


def test_the_chunked_planner_loss_gives_the_unchunked_gradients(batch) -> None:
    trainer, inputs = batch
    inputs = with_advantages(inputs)
    assert _decisions(inputs) > 2  # chunks of 1 and 2 do split it
    whole_loss, whole = _planner_gradients(trainer, inputs, chunk=1000)
    assert whole_loss != 0 and whole
    for chunk in (1, 2):
        loss, grads = _planner_gradients(trainer, inputs, chunk)
        assert loss == pytest.approx(whole_loss, rel=1e-5)
        assert len(grads) == len(whole)
        for got, expected in zip(grads, whole, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-7)


def _peak_planner_activations(trainer, inputs: dict, chunk: int) -> int:
    trainer.rsim.planner_chunk = chunk
    try:
        with SavedActivations(trainer.planner) as saved:
            trainer._planner_loss(inputs).backward()
    finally:
        trainer.rsim.planner_chunk = RSIMConfig().planner_chunk
        trainer.planner.zero_grad()
    assert saved.live == 0  # every graph was freed
    return saved.peak


def _twice(inputs: dict) -> dict:
    """The micro-batch with every sample twice: twice the planner decisions."""
    keys = ("planner_contexts", "planner_actions", "planner_old_logps", "planner_tokens")
    doubled = {key: inputs[key] + inputs[key] for key in keys}
    advantages = inputs["planner_advantages"]
    return {**inputs, **doubled, "planner_advantages": torch.cat([advantages, advantages])}


def test_the_planner_activations_scale_with_the_chunk_not_the_decisions(batch) -> None:
    trainer, inputs = batch
    inputs = with_advantages(inputs)
    doubled = _twice(inputs)
    # One pass over every decision (the old loss): twice the decisions, twice the bytes.
    unchunked = _peak_planner_activations(trainer, inputs, chunk=1000)
    assert _peak_planner_activations(trainer, doubled, chunk=1000) > 1.8 * unchunked
    # In chunks of one decision: the peak is the longest context's, however many there are.
    one = _peak_planner_activations(trainer, inputs, chunk=1)
    assert _peak_planner_activations(trainer, doubled, chunk=1) == one
    assert one < unchunked / 2


def test_guidance_tokens_get_no_reasoner_gradient(batch) -> None:
    trainer, inputs = batch
    inputs = with_advantages(inputs)
    model = trainer.model
    hidden: list = []

    def keep(module, args, out) -> None:
        out.retain_grad()
        hidden.append(out)

    hook = model.model.norm.register_forward_hook(keep)
    GRPOTrainer._compute_loss(trainer, model, inputs).backward()
    hook.remove()
    model.zero_grad()
    grad = hidden[-1].grad
    prompt_len = inputs["prompt_ids"].shape[1]
    guided = 0
    for row in range(grad.shape[0]):
        if inputs["advantages"][row] == 0:
            continue  # no signal to carry: every position is 0 anyway
        mask = inputs["tool_mask"][row]
        for j in range(int(inputs["completion_mask"][row].sum())):
            g = grad[row, prompt_len + j - 1].abs().sum()
            assert (g == 0) if mask[j] == 0 else (g > 0), (row, j)
            guided += int(mask[j] == 0)
    assert guided > 0  # some guidance tokens were checked


def test_joint_training_moves_both_and_saves_the_planner_with_every_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = train_grpo(resolve_run(_config(tiny_model_dir, tmp_path)))
    logged = [json.loads(line) for line in (tmp_path / METRICS).read_text().splitlines()]
    rows = [h for h in logged if "reward" in h]
    assert [h["planner/lambda"] for h in rows] == [0.7, 0.3]
    expected = {"planner/reward", "planner/terminal", "planner/penalty", "rewards/follow/mean"}
    assert expected <= set(rows[0]) and "strategies/terminal" in rows[0]
    assert (tmp_path / STRATEGY_PLOT).is_file() and result.steps == 2
    for step in (1, 2):
        assert (tmp_path / "checkpoints" / f"checkpoint-{step}" / PLANNER_DIR / HEAD_FILE).is_file()
    fresh = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=0)
    trained = load_file(str(tmp_path / PLANNER_DIR / HEAD_FILE))
    assert not torch.equal(trained["weight"], fresh.head.weight.detach())
    # The final planner is the last checkpoint's: the same logits.
    last = tmp_path / "checkpoints" / "checkpoint-2" / PLANNER_DIR
    assert torch.equal(_logits(tmp_path / PLANNER_DIR), _logits(last))
    assert (tmp_path / PLANNER_DIR / BACKBONE_DIR).is_dir()

    # Continual training: a new run given the saved planner starts from exactly it.
    protocol = ProtocolConfig(planner=str(tmp_path / PLANNER_DIR))
    again = _config(tiny_model_dir, tmp_path / "continual", protocol=protocol)
    bench = load_benchmark(again.data, limit=again.limit)
    trainer, collaborators = build_trainer(resolve_run(again), bench, tmp_path / "continual", None)
    with torch.no_grad():
        assert torch.equal(trainer.planner.logits(CONTEXTS), _logits(tmp_path / PLANNER_DIR))
    collaborators.close()


def test_resume_starts_from_the_checkpoint_planner(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A constant rate: a linear decay would reach 0 at the last step, and move nothing.
    constant = {"lr_scheduler_type": "constant"}
    train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, steps=1, trl=constant)))
    checkpoint = tmp_path / "checkpoints" / "checkpoint-1"
    saved = _logits(checkpoint / PLANNER_DIR)
    config = _config(tiny_model_dir, tmp_path, steps=2, resume=True, trl=constant)
    bench = load_benchmark(config.data, limit=config.limit)
    trainer, protocol = build_trainer(resolve_run(config), bench, tmp_path, str(checkpoint))
    with torch.no_grad():
        assert torch.equal(trainer.planner.logits(CONTEXTS), saved)
    protocol.close()
    result = train_grpo(resolve_run(config))
    assert result.steps == 2
    assert not torch.equal(_logits(tmp_path / PLANNER_DIR), saved)  # step 2 trained it


@pytest.mark.parametrize("train", ["planner", "reasoner"])
def test_one_agent_trains_while_the_other_stays_frozen(
    train: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # Eight episodes of up to 48 tokens, room for a second strategy: some groups' rewards
    # differ, for either agent (with four of 24 tokens, every planner reward could tie).
    sampling = DecodingConfig(n=2, max_tokens=48, temperature=1.0)
    rsim = RSIMConfig(train=train)
    config = _config(
        tiny_model_dir, tmp_path, steps=1, rsim=rsim, sampling=sampling, prompts_per_step=4
    )
    train_grpo(resolve_run(config))
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    reasoner_moved = any(not torch.equal(start[k], final[k]) for k in start)
    fresh = RSIMPlanner.from_ref(str(tiny_model_dir), head_seed=0).head.weight.detach()
    trained = load_file(str(tmp_path / PLANNER_DIR / HEAD_FILE))["weight"]
    planner_moved = not torch.equal(trained, fresh)
    expected = (False, True) if train == "planner" else (True, False)
    assert (reasoner_moved, planner_moved) == expected


@pytest.mark.parametrize("checkpointing", [True, False])
def test_the_planner_checkpoints_where_the_reasoner_does(
    checkpointing: bool, tiny_model_dir: Path, tmp_path: Path
) -> None:
    trl = {"gradient_checkpointing": checkpointing}
    config = _config(tiny_model_dir, tmp_path, trl=trl)
    bench = load_benchmark(config.data, limit=config.limit)
    trainer, protocol = build_trainer(resolve_run(config), bench, tmp_path, None)
    protocol.close()
    layers = trainer.planner.backbone.model.layers
    assert trainer.args.gradient_checkpointing is checkpointing
    assert all(layer.gradient_checkpointing is checkpointing for layer in layers)
    assert all(layer.training is checkpointing for layer in layers)


def test_a_prompted_planner_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    from collabrl.errors import UserError

    protocol = ProtocolConfig(planner="x", strategy=StrategyConfig(planner_kind="prompting"))
    with pytest.raises(UserError, match="trains an rsim planner"):
        resolve_run(_config(Path("unused"), tmp_path, protocol=protocol))


class Movement(TrainerCallback):
    """How far each agent's parameters moved at every optimizer step (L2 norm)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.last = self._flat()
        self.steps: list[tuple[float, float]] = []

    def _flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        def flat(params) -> torch.Tensor:
            return torch.cat([p.detach().flatten().clone() for p in params if p.requires_grad])

        return flat(self.trainer.planner.parameters()), flat(self.trainer.model.parameters())

    def on_step_end(self, args, state, control, **kwargs) -> None:
        now = self._flat()
        moved = [float((a - b).norm()) for a, b in zip(now, self.last, strict=True)]
        self.steps.append((moved[0], moved[1]))
        self.last = now


def _stage_ratios(tiny_model_dir: Path, out: Path, first: float, after: float) -> tuple:
    """(planner, reasoner): how much farther each moved per step in stage 1 than in 2."""
    rsim = RSIMConfig(lambda_first=first, lambda_after=after, lambda_switch_step=2)
    config = _config(tiny_model_dir, out, steps=4, rsim=rsim, trl={"lr_scheduler_type": "constant"})
    bench = load_benchmark(config.data, limit=config.limit)
    trainer, protocol = build_trainer(resolve_run(config), bench, out, None)
    movement = Movement(trainer)
    trainer.add_callback(movement)
    try:
        trainer.train()
    finally:
        protocol.close()
    stage1, stage2 = movement.steps[:2], movement.steps[2:]
    return tuple(sum(s[i] for s in stage1) / sum(s[i] for s in stage2) for i in (0, 1))


def test_lambda_changes_how_far_each_agent_moves(tiny_model_dir: Path, tmp_path: Path) -> None:
    """λ 0.7 → 0.3 against its mirror 0.3 → 0.7 from the same start: Adam's own drift
    between the stages is common to both, so their ratio shows λ alone. λ predicts
    (0.7/0.3) / (0.3/0.7) = 5.4 for the planner and its inverse for the reasoner; a
    loss weight, which AdamW normalises away, would give about 1."""
    planner_first = _stage_ratios(tiny_model_dir, tmp_path / "a", 0.7, 0.3)
    reasoner_first = _stage_ratios(tiny_model_dir, tmp_path / "b", 0.3, 0.7)
    planner = planner_first[0] / reasoner_first[0]
    reasoner = planner_first[1] / reasoner_first[1]
    print(f"lambda effect: planner {planner:.2f}, reasoner {reasoner:.2f}")
    assert planner > 2.5 and reasoner < 0.4
