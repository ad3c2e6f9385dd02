"""What the dry run of EAPO's paper config shows of what would run out (issue 50): the
colocated vLLM's KV cache in sequences of its length beside the generation it runs,
the periodic evaluation's memory (refused where it cannot fit), the checkpoints' disk,
K experts with the penalty and the ρ_s / turn-budget schedules, and no TRL key the
installed TRL has deprecated. No weight is loaded: the 7B policy is sized from the
shape shipped for it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from collabrl.config import build_config, read_yaml
from collabrl.errors import UserError
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.plan import deprecated_trl_keys, plan_run
from collabrl.train.plan_rows import TrainPlan
from collabrl.train.resolve import resolve_run

ROOT = Path(__file__).parents[2]
EAPO = ROOT / "configs" / "train" / "eapo-r1-distill-7b.yaml"
ZERO3 = ROOT / "configs" / "accelerate" / "zero3.yaml"


@pytest.fixture(autouse=True)
def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import collabrl.models

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run loaded a model")

    monkeypatch.setattr(collabrl.models, "load_model", refuse)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")  # the experts elsewhere


def _eapo(**changes) -> GRPOTrainConfig:
    return build_config(GRPOTrainConfig, [read_yaml(EAPO), changes])


def _rows(plan: TrainPlan, section: str) -> dict[str, str]:
    return dict(plan.sections[section])


def _trl(config: GRPOTrainConfig, **trl) -> GRPOTrainConfig:
    return dataclasses.replace(config, trl={**config.trl, **trl})


def test_the_kv_cache_is_shown_in_sequences_beside_the_generation() -> None:
    plan = plan_run(resolve_run(_eapo()), ZERO3)
    rows = _rows(plan, "colocated vLLM (estimate)")
    assert rows["KV cache"] == "56 KiB a token: 16.6 sequences of 22528 tokens"
    assert rows["a generation runs at once"].startswith("96 sequences")
    assert rows["largest share training leaves"].startswith("0.65")
    (warning,) = [w for w in plan.warnings if "KV cache" in w]
    assert "holds 16.6 sequences of 22528 tokens and a generation runs 96 at once" in warning
    # The value the config shipped before: about five sequences.
    old = plan_run(resolve_run(_trl(_eapo(), vllm_gpu_memory_utilization=0.3)), ZERO3)
    assert _rows(old, "colocated vLLM (estimate)")["KV cache"].endswith(
        "6.7 sequences of 22528 tokens"
    )


def test_a_share_that_cannot_hold_one_sequence_is_a_warning() -> None:
    plan = plan_run(resolve_run(_trl(_eapo(), vllm_gpu_memory_utilization=0.15)), ZERO3)
    (warning,) = [w for w in plan.warnings if "KV cache" in w]
    assert "cannot hold one sequence of 22528 tokens: vLLM refuses to start" in warning
    assert "up to 0.65" in warning


@pytest.mark.parametrize("processes", [8, 4])
def test_the_shipped_share_leaves_training_its_estimate(processes: int) -> None:
    """On zero3.yaml's 8 processes and on docs/launch.md's 4 (experts on the other 4)."""
    plan = plan_run(resolve_run(_eapo()), ZERO3, num_processes=processes)
    rows = _rows(plan, "memory per device (estimate)")
    assert rows["GPU (assumed: none here)"].startswith("79 GiB, 44 GiB for training")
    assert not [w for w in plan.warnings if "exceeds" in w]
    room = float(_rows(plan, "colocated vLLM (estimate)")["largest share training leaves"][:4])
    assert _eapo().trl["vllm_gpu_memory_utilization"] <= room


def test_one_process_is_told_the_7b_policy_does_not_fit() -> None:
    plan = plan_run(resolve_run(_eapo()))
    assert any(w.startswith("the estimate (130 GiB) exceeds") for w in plan.warnings)


def test_the_periodic_evaluation_states_its_memory_and_refuses_what_cannot_fit() -> None:
    config = _eapo(eval_data="arith", eval_steps=10)
    with pytest.raises(UserError, match="needs about 83 GiB per GPU") as refused:
        plan_run(resolve_run(config), ZERO3)
    assert refused.value.fix == "set engine.batch_size to 12 or less"
    fits = dataclasses.replace(config, engine=dataclasses.replace(config.engine, batch_size=12))
    rows = _rows(plan_run(resolve_run(fits), ZERO3), "periodic evaluation (eval_steps, estimate)")
    assert rows["engine"] == (
        "transformers' generate on the live policy, gathered whole by ZeRO-3, in every process"
    )
    assert rows["memory per GPU"].startswith("78.4 GiB: training state 14.2 + gathered policy 14.2")
    # No evaluation during training: nothing to refuse, no section.
    assert (
        "periodic evaluation (eval_steps, estimate)"
        not in plan_run(resolve_run(_eapo()), ZERO3).sections
    )


def test_the_cli_refusal_is_one_line(tmp_path: Path) -> None:
    command = ["train", "eapo", "-c", str(EAPO), "--eval-data", "arith", "--eval-steps", "10"]
    command += ["--dry-run", "--accelerate-config", str(ZERO3), "--out", str(tmp_path / "run")]
    done = subprocess.run(
        [sys.executable, "-m", "collabrl", *command], capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "eval_steps: the periodic evaluation generates with transformers" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_checkpoints_disk_need_is_shown() -> None:
    rows = _rows(plan_run(resolve_run(_eapo()), ZERO3), "disk (estimate)")
    assert rows["a checkpoint"].startswith("106.6 GB (bf16 weights 2 B + fp32 master weights")
    assert rows["checkpoints kept"] == "2 (save_total_limit) = 213.2 GB"
    plan = plan_run(resolve_run(_trl(_eapo(), save_only_model=True)), ZERO3)
    assert _rows(plan, "disk (estimate)")["a checkpoint"].startswith("15.2 GB (bf16 weights 2 B")
    assert any("--resume cannot continue a run from them" in w for w in plan.warnings)


def test_no_deprecated_trl_key_is_shown() -> None:
    plan = plan_run(resolve_run(_eapo()), ZERO3)
    shown = set(_rows(plan, "TRL (effective)"))
    assert "vllm_importance_sampling_cap" in deprecated_trl_keys()  # this TRL's
    assert not shown & deprecated_trl_keys()
    assert "vllm_importance_sampling_clip_max" in shown  # the cap under its current name


def test_k_experts_their_penalty_and_schedules_are_shown() -> None:
    plan = plan_run(resolve_run(_eapo()), ZERO3)
    placement = _rows(plan, "who runs where")
    assert placement["experts 1–3 of K = 3"] == "server at http://127.0.0.1:8001/v1 (not contacted)"
    rows = _rows(plan, "eapo (experts and schedules)")
    assert rows["experts"].startswith("K = 3 (up to K queries a turn, 10 an episode)")
    assert rows["consultation penalty"] == "0.0 per expert query"
    # 560 steps on 8 processes, 3 optimizer steps a generation.
    assert rows["rollout generations"] == "187 over 560 optimizer steps"
    assert rows["ρ_s (answers accepted)"].startswith("1/s (EAPO §2): 1 at 1, 0.5 at 2, 0.1 at 10")
    assert rows["turn budget"].startswith("6 from 1, 5 from 20,")
    assert ", 1 from " in rows["turn budget"]


def test_two_endpoints_serve_the_panel_round_robin() -> None:
    config = _eapo()
    experts = ["http://a:8001/v1", "http://b:8001/v1"]
    protocol = dataclasses.replace(config.protocol, experts=experts)
    placement = _rows(
        plan_run(resolve_run(dataclasses.replace(config, protocol=protocol))), "who runs where"
    )
    assert placement["experts 1, 3 of K = 3"] == "server at http://a:8001/v1 (not contacted)"
    assert placement["experts 2 of K = 3"] == "server at http://b:8001/v1 (not contacted)"


def test_the_paper_config_states_its_consultation_penalty() -> None:
    raw = yaml.safe_load(EAPO.read_text())
    assert raw["consult_penalty"] == 0.0  # explicit, with where it comes from beside it
    assert "penalty term on consultation" in EAPO.read_text()
