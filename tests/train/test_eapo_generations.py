"""EAPO's schedules on a real TRL run: ρ_s and the turn budget count rollout generations
(issue 32), across a resume too, and every episode's end reason is logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl.config import DecodingConfig
from collabrl.episode import EndReason
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.consult_config import ConsultConfig, turn_tokens
from collabrl.train.grpo import train_grpo
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.resolve import resolve_run
from collabrl.train.run import METRICS

# One reference expert with short answers: a budget that holds one full turn.
CONSULT = ConsultConfig(num_experts=1, expert_max_tokens=8)


def _config(model: Path, out: Path, steps: int, **changes) -> GRPOTrainConfig:
    fields = {
        "method": "eapo",
        "model": str(model),
        "data": "arith_train",
        "limit": 8,
        "out": str(out),
        "steps": steps,
        "prompts_per_step": 1,
        "sampling": DecodingConfig(n=2, max_tokens=turn_tokens(CONSULT), temperature=1.0),
        "save_steps": 3,
        "protocol": ProtocolConfig(experts=["reference"], consult=CONSULT),
        # Three optimizer steps per generation, as the shipped EAPO config trains.
        "trl": {"gradient_accumulation_steps": 1, "steps_per_generation": 3},
    }
    return GRPOTrainConfig(**(fields | changes))


def _generations(out: Path) -> list[dict]:
    """The logged steps that generated (the rewards are computed once per generation)."""
    logged = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    return [s for s in logged if "episodes/accept_prob" in s]


@pytest.mark.slow
def test_rho_counts_generations_and_a_resume_continues_the_count(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, steps=6)))
    first = _generations(tmp_path)
    # ρ_s = 1/s over generations: 1, 1/2 (counting optimizer steps gave 1, 1/4).
    assert [s["step"] for s in first] == [1, 4]
    assert [s["episodes/accept_prob"] for s in first] == [1.0, 0.5]
    shares = [sum(s[f"episodes/end/{r}"] for r in EndReason) for s in first]
    assert shares == pytest.approx([1.0, 1.0])  # every episode ended for one logged reason
    train_grpo(resolve_run(_config(tiny_model_dir, tmp_path, steps=9, resume=True)))
    resumed = _generations(tmp_path)
    assert [s["episodes/accept_prob"] for s in resumed] == [1.0, 0.5, pytest.approx(1 / 3)]
    # The 6-step run's horizon (pinned): the turn budget reached its end at generation 2.
    assert [s["turn_budget"] for s in resumed] == [6, 1, 1]
