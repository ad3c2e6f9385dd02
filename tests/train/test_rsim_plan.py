"""`collab train rsim --dry-run`: the planner's activations in the memory estimate, and
each agent's learning rate as λ scales it, for the paper config."""

from __future__ import annotations

from pathlib import Path

import pytest

from collabrl.config import build_config, read_yaml
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.plan import plan_run
from collabrl.train.resolve import resolve_run

PAPER = Path(__file__).parents[2] / "configs" / "train" / "rsim-qwen2.5-0.5b.yaml"


def _rows(**changes) -> dict[str, str]:
    config = build_config(GRPOTrainConfig, [read_yaml(PAPER), changes])
    plan = plan_run(resolve_run(config))
    return {key: value for rows in plan.sections.values() for key, value in rows}


def _gib(value: str) -> float:
    return float(value.split()[0])


def _planner_activations(rows: dict[str, str]) -> tuple[str, float]:
    [(label, value)] = [(k, v) for k, v in rows.items() if k.startswith("planner activations")]
    return label, _gib(value)


def test_the_paper_config_counts_one_chunk_of_planner_activations() -> None:
    rows = _rows()
    label, chunk16 = _planner_activations(rows)
    # 16 of the 16 samples × 12 strategies of a micro-batch, checkpointed as the policy.
    assert label.startswith("planner activations (16 of up to 192 decisions × ")
    assert label.endswith(", checkpointed)")
    state = _gib(rows["planner weights + gradients + AdamW"])
    _, chunk4 = _planner_activations(_rows(rsim={"planner_chunk": 4}))
    assert chunk16 == pytest.approx(4 * chunk4, rel=0.05)  # one chunk's, so 4× the decisions
    policy = ("weights + gradients + AdamW (16 B a parameter)", "reference model")
    terms = [k for k in rows if k.startswith(("activations", "log-probs")) or k in policy]
    counted = sum(_gib(rows[k]) for k in terms) + state + chunk16
    assert _gib(rows["training total"]) == pytest.approx(counted, abs=0.2)
    # Without checkpointing, a chunk keeps every layer's activations: many times more.
    _, full = _planner_activations(_rows(trl={"gradient_checkpointing": False}))
    assert full > 5 * chunk16


def test_the_paper_config_runs_trls_grpo_loss_and_checkpoints() -> None:
    rows = _rows()
    assert rows["loss_type"] == "grpo"  # §4's 1/G Σ_j 1/|o_j| Σ_t (see the header)
    assert rows["gradient checkpointing"] == "True"


def test_the_dry_run_shows_each_agents_rate_under_lambda() -> None:
    rows = _rows(steps=20)
    schedule = "then × the cosine schedule"
    assert rows["planner learning rate"] == (
        f"2e-05 × 0.7 = 1.4e-05 (steps 1–10); 2e-05 × 0.3 = 6e-06 (steps 11–20); {schedule}"
    )
    assert rows["reasoner learning rate"] == (
        f"2e-05 × 0.3 = 6e-06 (steps 1–10); 2e-05 × 0.7 = 1.4e-05 (steps 11–20); {schedule}"
    )
    rows = _rows(steps=20, rsim={"lambda_switch_step": 4, "planner_learning_rate": 1e-5})
    assert rows["planner learning rate"].startswith("1e-05 × 0.7 = 7e-06 (steps 1–4); 1e-05")
    rows = _rows(steps=0, rsim={"train": "planner"})  # 0: one epoch
    assert rows["planner learning rate"] == f"2e-05 ({schedule})"
    assert rows["reasoner learning rate"] == "frozen (rsim.train)"
