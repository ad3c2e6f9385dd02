"""EAPO's schedules: ρ_s and the turn budget, and the callback that drives a protocol."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import DefaultFlowCallback, TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler

from collabrl.config import PoolConfig
from collabrl.engines.base import SamplingParams
from collabrl.engines.pool import ExpertPool
from collabrl.engines.reference import REFERENCE, Reference
from collabrl.episode import EndReason
from collabrl.errors import UserError
from collabrl.protocols.base import Policy, Task
from collabrl.protocols.consult import ConsultConfig, ConsultProtocol
from collabrl.train.schedule_config import Clock, ScheduleConfig
from collabrl.train.schedules import ScheduleCallback, accept_prob, turn_budget
from tests.protocols.scripted import ScriptedEngine
from tests.protocols.test_consult import calls

# ----------------------------------------------------------------------------- rho


def test_inverse_is_one_over_s() -> None:
    config = ScheduleConfig()  # the paper's schedule is the default
    assert [accept_prob(s, config) for s in range(1, 6)] == [1.0, 1 / 2, 1 / 3, 1 / 4, 1 / 5]


def test_constant_and_off() -> None:
    constant = ScheduleConfig(accept="constant", accept_value=0.3)
    assert {accept_prob(s, constant) for s in (1, 2, 1000)} == {0.3}
    off = ScheduleConfig(accept="off")
    assert {accept_prob(s, off) for s in (1, 2, 1000)} == {0.0}


def test_linear_endpoints_and_midpoint() -> None:
    config = ScheduleConfig(accept="linear", accept_end=0.3, accept_steps=5)
    assert accept_prob(1, config) == 1.0
    assert accept_prob(3, config) == pytest.approx(0.65)  # halfway from 1 to 0.3
    assert accept_prob(5, config) == 0.3  # exact, not 0.30000000000000004
    assert accept_prob(50, config) == 0.3  # held after the window


def test_steps_count_from_one() -> None:
    for accept in ("inverse", "constant", "linear", "off"):
        with pytest.raises(ValueError, match="from 1"):
            accept_prob(0, ScheduleConfig(accept=accept, accept_steps=3))
    with pytest.raises(ValueError, match="from 1"):
        turn_budget(0, ScheduleConfig(anneal_steps=3))


def test_unresolved_run_length_is_a_bug() -> None:
    with pytest.raises(ValueError, match="for_run"):
        turn_budget(1, ScheduleConfig())
    resolved = ScheduleConfig(accept="linear").for_run(10)
    assert (resolved.accept_steps, resolved.anneal_steps) == (10, 10)
    assert ScheduleConfig(anneal_steps=4).for_run(10).anneal_steps == 4


# ----------------------------------------------------------------------------- turn budget


def test_turn_budget_start_end_and_rounding() -> None:
    config = ScheduleConfig(turn_budget_start=6, turn_budget_end=1, anneal_steps=11)
    # Linear 6 → 1 over steps 1..11 is 6 - (s - 1) / 2: the halves go towards the end value.
    budgets = [turn_budget(s, config) for s in range(1, 14)]
    assert budgets == [6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1]
    assert turn_budget(1, config) == 6 and turn_budget(11, config) == 1


def test_turn_budget_without_annealing_or_window() -> None:
    flat = ScheduleConfig(turn_budget_start=4, turn_budget_end=4, anneal_steps=10)
    assert {turn_budget(s, flat) for s in range(1, 20)} == {4}
    one_step = ScheduleConfig(anneal_steps=1)
    assert turn_budget(1, one_step) == 1  # a window of one step is its end


@given(
    end=st.integers(1, 20),
    extra=st.integers(0, 30),
    steps=st.integers(1, 200),
    step=st.integers(1, 250),
)
def test_turn_budget_is_the_nearest_integer_and_monotone(
    end: int, extra: int, steps: int, step: int
) -> None:
    config = ScheduleConfig(turn_budget_start=end + extra, turn_budget_end=end, anneal_steps=steps)
    budget = turn_budget(step, config)
    assert end <= budget <= end + extra and budget >= turn_budget(step + 1, config)
    if steps > 1:
        exact = end + extra - Fraction(extra * (min(step, steps) - 1), steps - 1)
        assert abs(budget - exact) <= Fraction(1, 2)
    if step >= steps:
        assert budget == end


# ----------------------------------------------------------------------------- check


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"accept": "cosine"}, "unknown accept schedule 'cosine'"),
        ({"accept_value": 1.5}, "schedule.accept_value must be in"),
        ({"accept_end": float("nan")}, "schedule.accept_end must be in"),
        ({"accept_steps": -1}, "schedule.accept_steps must be >= 0"),
        ({"anneal_steps": -1}, "schedule.anneal_steps must be >= 0"),
        ({"turn_budget_end": 0}, "schedule.turn_budget_end must be >= 1"),
        ({"turn_budget_start": 2, "turn_budget_end": 3}, "the budget only shrinks"),
    ],
)
def test_check_refuses_impossible_values(changes: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        ScheduleConfig(**changes).check()


def test_defaults_pass_check() -> None:
    ScheduleConfig().check()


# ----------------------------------------------------------------------------- the callback


def _step(callback: ScheduleCallback, step: int, max_steps: int) -> None:
    """What the rollout does when it generates for optimizer step `step`, one generation
    per step: global_step counts steps done, no micro-batch of this one is."""
    state = TrainerState(global_step=step - 1, max_steps=max_steps)
    callback.on_generation(SimpleNamespace(gradient_accumulation_steps=1), state, 0)


def test_callback_drives_a_consult_protocol_and_logs(smol_tokenizer) -> None:
    protocol = ConsultProtocol(
        Policy(ScriptedEngine(smol_tokenizer, []), smol_tokenizer),
        None,
        ConsultConfig(mode="locked"),
    )
    callback = ScheduleCallback(ScheduleConfig(turn_budget_start=5), protocol)
    seen = []
    for step in range(1, 6):
        _step(callback, step, max_steps=5)
        logs = {"loss": 0.1}
        callback.on_log(None, TrainerState(global_step=step), TrainerControl(), logs=logs)
        seen.append((protocol.config.accept_prob, protocol.config.turn_budget))
        assert logs == {"loss": 0.1, "accept_prob": 1 / step, "turn_budget": 6 - step}
    assert seen == [(1 / s, 6 - s) for s in range(1, 6)]
    protocol.config.check()  # the values written are ones the protocol accepts


class LogRecorder(TrainerCallback):
    """A reporting callback: keeps the logs it was shown."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        self.logs.append(dict(logs))


def test_logs_reach_the_callbacks_after_it(smol_tokenizer) -> None:
    protocol = ConsultProtocol(
        Policy(ScriptedEngine(smol_tokenizer, []), smol_tokenizer),
        None,
        ConsultConfig(mode="locked"),
    )
    callback = ScheduleCallback(ScheduleConfig(anneal_steps=3), protocol)
    recorder = LogRecorder()
    handler = CallbackHandler([DefaultFlowCallback(), callback, recorder], None, None, None, None)
    _step(callback, 3, max_steps=3)
    state = TrainerState(global_step=3, max_steps=3)
    handler.on_log(None, state, TrainerControl(), {"loss": 0.5})
    assert recorder.logs == [{"loss": 0.5, "accept_prob": 1 / 3, "turn_budget": 1}]


def test_open_protocol_runs_with_the_scheduled_values(smol_tokenizer) -> None:
    """Each simulated step's run sees that step's ρ and turn budget (3, 2, then 1)."""
    config = ScheduleConfig(turn_budget_start=3, turn_budget_end=1)
    task = Task("p", "What is 6 * 7?", reference=Reference("42"))
    params = SamplingParams(max_tokens=400, seed=0)
    pool = ExpertPool(PoolConfig(endpoints=[REFERENCE], num_experts=3), tokenizer=smol_tokenizer)
    with pool:
        # Steps 1 and 2: a call, then the answer; step 3 ends at its call.
        replies = [calls((1, "6 * 7?")), "Answer: 42"] * 2 + [calls((1, "6 * 7?"))]
        engine = ScriptedEngine(smol_tokenizer, replies)
        protocol = ConsultProtocol(Policy(engine, smol_tokenizer), pool, ConsultConfig())
        callback = ScheduleCallback(config, protocol)
        episodes = []
        for step in range(1, 4):
            _step(callback, step, max_steps=3)
            episodes.extend(protocol.run([task], params))
    assert [e.meta["accept_prob"] for e in episodes] == [1.0, 1 / 2, 1 / 3]
    assert episodes[0].calls[0].meta["accepted"]  # ρ_1 = 1 accepts every answer
    assert [e.end for e in episodes[:2]] == [EndReason.EOS, EndReason.EOS]
    assert episodes[2].end == EndReason.TURN_BUDGET  # budget 1: a call ends the episode


# ----------------------------------------------------------------------------- horizons


def _run_config(method: str, **changes):
    from collabrl.train.grpo_config import GRPOTrainConfig

    return GRPOTrainConfig(method=method, **changes)


@pytest.mark.parametrize("method", ["eapo", "rsim"])
def test_a_fresh_run_pins_its_horizons_to_its_steps(method: str, tmp_path) -> None:
    from collabrl.train.schedules import pin_horizons

    pinned = pin_horizons(_run_config(method, steps=10), tmp_path)
    if method == "eapo":
        assert (pinned.schedule.accept_steps, pinned.schedule.anneal_steps) == (10, 10)
        assert pinned.rsim.lambda_switch_step == 0  # not eapo's
    else:
        assert pinned.rsim.lambda_switch_step == 5
        assert pinned.schedule.accept_steps == 0
    given_ = _run_config(method, steps=10, schedule=ScheduleConfig(anneal_steps=4))
    assert pin_horizons(given_, tmp_path).schedule.anneal_steps == 4  # a number is kept


@pytest.mark.parametrize("method", ["eapo", "rsim"])
def test_a_resume_with_more_steps_keeps_the_saved_horizons(method: str, tmp_path) -> None:
    from collabrl.config import save_config
    from collabrl.runs import CONFIG
    from collabrl.train.schedules import pin_horizons

    first = pin_horizons(_run_config(method, steps=10), tmp_path)
    save_config(first, tmp_path / CONFIG)
    resumed = pin_horizons(_run_config(method, steps=40, resume=True), tmp_path)
    assert resumed.schedule == first.schedule and resumed.rsim == first.rsim
    # Without pinning, the resumed run's horizons would have followed --steps 40.
    fresh = pin_horizons(_run_config(method, steps=40), tmp_path)
    assert (fresh.schedule, fresh.rsim) != (first.schedule, first.rsim)


# ----------------------------------------------------------------------------- generations


def test_the_clock_counts_generations_not_optimizer_steps() -> None:
    """The shipped EAPO config: 32 micro-batches a step, 96 a generation (3 updates)."""
    clock = Clock(accumulation=32, per_generation=96)
    assert [clock.generation(step, 0) for step in (0, 3, 6)] == [1, 2, 3]
    assert clock.generation(4, 0) == 3  # resumed mid-generation: the next one starts
    assert clock.generations_in(20) == 7  # 20 steps train on 6⅔ generations: 7 begin
    # Several generations within one optimizer step (steps_per_generation below accumulation).
    small = Clock(accumulation=4, per_generation=2)
    assert [small.generation(1, micro) for micro in (0, 2)] == [3, 4]
    args = SimpleNamespace(gradient_accumulation_steps=2, steps_per_generation=6, num_iterations=2)
    assert Clock.of(args) == Clock(2, 12)  # μ passes over a generation reuse it
    assert Clock.of(SimpleNamespace(gradient_accumulation_steps=2)) == Clock(2, 2)


def _trl_rollouts(callback: ScheduleCallback, clock: Clock, first_step: int, steps: int):
    """ρ of each generation, as TRL makes them: micro-batches counted from 0 in this
    process (a resumed one too), a generation each `per_generation` of them."""
    seen = []
    for micro in range((steps - first_step) * clock.accumulation):
        if micro % clock.per_generation == 0:
            state = TrainerState(
                global_step=first_step + micro // clock.accumulation, max_steps=steps
            )
            args = SimpleNamespace(
                gradient_accumulation_steps=clock.accumulation,
                steps_per_generation=clock.per_generation,
                num_iterations=1,
            )
            callback.on_generation(args, state, micro)
            seen.append(callback.target.config.accept_prob)
    return seen


def test_rho_is_one_over_the_generation_with_three_updates_a_generation(smol_tokenizer) -> None:
    """Issue 32: with steps_per_generation = 3 × accumulation, ρ ran 1, 1/4, 1/7 (optimizer
    steps); EAPO's step samples a batch and learns from it: 1, 1/2, 1/3."""
    protocol = ConsultProtocol(
        Policy(ScriptedEngine(smol_tokenizer, []), smol_tokenizer),
        None,
        ConsultConfig(mode="locked"),
    )
    callback = ScheduleCallback(ScheduleConfig(), protocol)
    clock = Clock(accumulation=2, per_generation=6)
    assert _trl_rollouts(callback, clock, 0, 9) == [1.0, 1 / 2, 1 / 3]
    # A run resumed from checkpoint 6 (a generation's end) generates the third.
    assert _trl_rollouts(callback, clock, 6, 9) == [1 / 3]
    # One resumed mid-generation (step 4) regenerates: that is the third, then the fourth.
    assert _trl_rollouts(callback, clock, 4, 9) == [1 / 3, 1 / 4]


def test_horizons_in_steps_cover_the_generations_they_train_on(smol_tokenizer) -> None:
    """anneal_steps (and its "whole run" 0) count optimizer steps: over a 9-step run of
    3 updates a generation, the budget reaches its end at the third, last generation."""
    protocol = ConsultProtocol(
        Policy(ScriptedEngine(smol_tokenizer, []), smol_tokenizer),
        None,
        ConsultConfig(mode="locked"),
    )
    config = ScheduleConfig(turn_budget_start=5, turn_budget_end=1)
    callback = ScheduleCallback(config, protocol)
    budgets = []
    for step in (0, 3, 6):
        state = TrainerState(global_step=step, max_steps=9)
        args = SimpleNamespace(gradient_accumulation_steps=1, steps_per_generation=3)
        callback.on_generation(args, state, 0)
        budgets.append(protocol.config.turn_budget)
    assert budgets == [5, 3, 1]
