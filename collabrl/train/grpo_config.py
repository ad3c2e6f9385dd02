"""The config of `collab train grpo|relay|eapo|rsim` (and of any method registered to
train by GRPO).

`GRPOTrainConfig` is what a run is (the policy, its data, the method's protocol and
reward, the schedules, the `trl` block). Like TRL's own config modules this one imports
no trainer and not TRL. What differs between methods it asks the method's spec
(`train/methods/`): the protocol a method rolls out on, the fields only it reads. What
needs the rollout protocol is checked once, when the run is resolved
(`train/resolve.py`); what needs TRL lives on the trainer side: `train/grpo_args.py`
turns the config into TRL's GRPOConfig and holds the checks that need TRL (`check_run`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from collabrl.config import DataColumns, DecodingConfig, EngineConfig, option
from collabrl.data.prompts import get_prompt
from collabrl.devices import check_dtype
from collabrl.errors import UserError, require
from collabrl.protocols import registry
from collabrl.protocols.config import ProtocolConfig
from collabrl.rewards.relay import CALL_RATIOS, SCENARIO_SCOPES
from collabrl.train.lora import LoraSettings
from collabrl.train.methods import registry as methods
from collabrl.train.rsim_config import RSIMConfig
from collabrl.train.schedule_config import ScheduleConfig
from collabrl.train.trackers import check_report_to


@dataclass
class GRPOTrainConfig(DataColumns):
    """A GRPO run: the policy, its data, the protocol it rolls out with, the reward."""

    method: str = option(
        "grpo",
        "grpo (solo protocol) | relay (RelayLLM, a teacher) | eapo (EAPO, experts) | "
        "rsim (rSIM, a planner trained beside the policy) | a registered method's name.",
    )
    model: str = option("smollm2-135m", "The policy to train: a local model reference.")
    data: str = option(
        "arith_train", "Training problems: a registered name or a .jsonl/.parquet/folder path."
    )
    limit: int | None = option(None, "Use only the first N problems.")
    prompt: str | None = option(None, "Policy prompt template (default: the data's own).")
    out: str | None = option(
        None, "Run folder (default: a new folder under runs/); --resume continues one."
    )
    reward: str = option(
        "difficulty_aware",
        "relay: simple (1(a=g) − ρ) | difficulty_aware (RelayLLM §3.2, by scenario_scope).",
    )
    scenario_scope: str = option(
        "group",
        "relay, difficulty_aware: where a scenario is decided: group (each prompt group "
        "over its own samples, the paper's text) | batch (one scenario for the whole "
        "generation batch, every process's samples: the authors' math_help_group.py).",
    )
    call_ratio: str = option(
        "realised",
        "relay: the ρ(y) the reward charges: realised (teacher tokens ÷ response tokens, "
        "the paper's definition; logged as episodes/call_ratio) | per_call (the authors' "
        "math_help_group.py: tokens_per_call for each call sent to the teacher, whatever "
        "its n, ÷ response tokens, at most 1; logged as episodes/call_ratio_per_call).",
    )
    tokens_per_call: int = option(
        500, "relay, call_ratio per_call: the tokens each call counts (the authors' 500)."
    )
    reward_funcs: list[str] = option(
        [],
        "Your own reward functions, module:function or path/to/file.py:function, with "
        "TRL's signature f(prompts, completions, **kwargs) -> list[float]; kwargs hold "
        "the episodes' extras (correct, f1, call_ratio, calls, …). TRL sums them with the "
        "method's (weights: trl.reward_weights).",
    )
    reward_mode: str = option(
        "add", "add: the method's reward plus reward_funcs; replace: reward_funcs alone."
    )
    consult_penalty: float = option(
        0.0, "eapo: reward subtracted per expert call (EAPO §1 mentions one; off by default)."
    )
    schedule: ScheduleConfig = option(
        ScheduleConfig(), "eapo: the acceptance ρ_s and turn-budget schedules over the run."
    )
    rsim: RSIMConfig = option(
        RSIMConfig(), "rsim: who learns (joint, planner, reasoner) and the λ schedule."
    )
    eval_data: str | None = option(
        None,
        "Held-out benchmark scored greedily before and after training (e.g. arith; eapo "
        "with the expert channel locked); unset: no evaluation.",
    )
    eval_split: str | None = option(
        None,
        "The held-out set's split when eval_data is a saved DatasetDict with several (its "
        "columns are named as the training data's: problem_field, answer_field, id_field).",
    )
    eval_limit: int | None = option(None, "Evaluate only the first N held-out problems.")
    eval_steps: int | None = option(
        None,
        "Also score the live policy on eval_data every N steps (eval-step-N/ folders, "
        "eval/pass@1 in metrics.jsonl and the curves); unset: only before and after.",
    )
    steps: int = option(
        20,
        "Optimizer steps (TRL max_steps); 0: one epoch of the training set (after "
        "max_prompt_tokens), ceil(problems × G / completions per optimizer step over all "
        "processes) × TRL num_iterations, written into the run's config.yaml as a number "
        "when it starts (a resume keeps it).",
    )
    max_prompt_tokens: int | None = option(
        None,
        "Problems whose prompt, rendered as the rollout renders it (its template and "
        "engine.chat_template_kwargs, in policy tokens), is longer are dropped when the run "
        "starts (EasyR1/verl's filter_overlong_prompts); also sizes the colocated vLLM "
        "(trl.vllm_max_model_length = this + sampling.max_tokens); none: no limit.",
    )
    prompts_per_step: int = option(4, "Problems per step; each gets sampling.n samples.")
    sampling: DecodingConfig = option(
        DecodingConfig(n=4, max_tokens=128, temperature=1.0),
        "How the policy samples rollouts: n is G, the group GRPO normalises over (TRL "
        "num_generations); max_tokens bounds an episode, every author's tokens "
        "(max_completion_length); the seed is the run's `seed`.",
    )
    learning_rate: float = option(1e-6, "AdamW learning rate (RelayLLM appendix E: 1e-6).")
    beta: float = option(0.0, "KL coefficient to the reference model (0: no reference model).")
    seed: int = option(0, "Seed of the data order, the rollouts and the initialisation.")
    resume: bool = option(False, "Continue from the last checkpoint in the run folder.")
    save_steps: int = option(10, "Save a checkpoint every N steps (what --resume starts from).")
    save_total_limit: int | None = option(
        2, "Checkpoints kept, older ones deleted (TRL save_total_limit); none keeps them all."
    )
    final_dtype: str = option(
        "auto",
        "Weights dtype of final/: auto (as trained: float32 master weights), bfloat16, "
        "float16, float32.",
    )
    lora: LoraSettings = option(
        LoraSettings(),
        "A LoRA adapter instead of all weights (--lora): the rollouts generate through it; "
        "final/ holds it merged unless lora.merge is false.",
    )
    save_rollouts: int = option(
        4,
        "Episodes of every step kept in rollouts.jsonl with their reward, its parts, their "
        "advantage and authored segments (`collab view RUN` prints them); 0: none.",
    )
    report_to: str = option(
        "none",
        "Experiment tracking, as TRL's report_to: none, tensorboard, wandb, trackio, or "
        "several joined by commas; the run folder keeps metrics.jsonl and its curves either way.",
    )
    protocol: ProtocolConfig = option(
        ProtocolConfig(), "The rollout protocol's collaborators (teacher for relay)."
    )
    engine: EngineConfig = option(
        EngineConfig(),
        "The policy's rollout engine (batch size, chat_template_kwargs, as collab eval "
        "renders them) and the device and dtype of local collaborators.",
    )
    trl: dict[str, Any] = option(
        {}, "Any other GRPOConfig argument, passed last (e.g. {loss_type: dapo})."
    )

    FIELD_HELP: ClassVar[dict[str, str]] = {
        "sampling.n": "G, the group: samples per problem that GRPO normalises over "
        "(TRL num_generations)."
    }
    # Flat sampling keys of 0.1, read for one release (config.py, RENAMED).
    RENAMED: ClassVar[dict[str, str]] = {
        "num_generations": "sampling.n",
        "max_tokens": "sampling.max_tokens",
        "temperature": "sampling.temperature",
    }

    def __post_init__(self) -> None:
        # A relay, eapo or rsim run rolls out on its method's protocol: the resolved config
        # names it (config.yaml, `config show`, the dry run), not the protocol section's
        # default, solo. A run folder saved before says solo, and reads as the method's
        # protocol all the same (--resume compares the configs as read). An unknown
        # method is left to `check`, which names the registered ones.
        method = methods.find(self.method)
        own = None if method is None else method.protocol
        if own is not None and self.protocol.name == ProtocolConfig().name:
            self.protocol = dataclasses.replace(self.protocol, name=own)

    def check(self) -> None:
        """Refuse values no run can use, before any data or model is loaded (what needs
        TRL is refused by `grpo_args.check_run`; what needs the rollout protocol, by
        `resolve.resolve_run`)."""
        method = methods.get(self.method)  # an unknown name lists the registered ones
        if not method.grpo:
            raise UserError(
                f"{self.method} is not trained by GRPO", f"run collab train {self.method}"
            )
        if self.reward not in ("simple", "difficulty_aware"):
            raise UserError(f"unknown reward '{self.reward}'", "use simple or difficulty_aware")
        require(
            "steps", self.steps, 0 <= self.steps <= MAX_STEPS, f"in [0, {MAX_STEPS}] (0: one epoch)"
        )
        limit = self.max_prompt_tokens
        require("max_prompt_tokens", limit, limit is None or limit >= 1, "at least 1 or none")
        self.sampling.check()
        require("sampling.n", self.sampling.n, self.sampling.n >= 2, "at least 2 (a GRPO group)")
        bound = MAX_ROLLOUT // self.sampling.n
        require(
            "prompts_per_step",
            self.prompts_per_step,
            1 <= self.prompts_per_step <= bound,
            f"in [1, {bound}] ({MAX_ROLLOUT} completions a step at most)",
        )
        temperature = self.sampling.temperature
        require("sampling.temperature", temperature, temperature > 0, "> 0 (GRPO samples)")
        require("learning_rate", self.learning_rate, 0 < self.learning_rate < 1, "in (0, 1)")
        require("beta", self.beta, 0 <= self.beta < math.inf, "a finite number >= 0")
        require("save_steps", self.save_steps, self.save_steps >= 1, "at least 1")
        limit = self.save_total_limit
        require("save_total_limit", limit, limit is None or limit >= 1, "at least 1 or none")
        check_dtype(self.final_dtype, "final_dtype")
        self.lora.check()
        keep = self.save_rollouts
        require("save_rollouts", keep, 0 <= keep <= MAX_ROLLOUT, f"in [0, {MAX_ROLLOUT}]")
        penalty = self.consult_penalty
        require("consult_penalty", penalty, 0 <= penalty < math.inf, "a finite number >= 0")
        check_report_to(self.report_to)
        self.check_rewards()
        check_method_fields(self)
        self.check_relay_reward()
        limit = self.eval_limit
        require("eval_limit", limit, limit is None or limit >= 1, "at least 1")
        self.check_eval_steps()
        self.schedule.check()
        self.rsim.check()
        self.engine.check()
        if self.prompt is not None:
            get_prompt(self.prompt)
        allowed = grpo_protocols() if method.any_grpo_protocol else (method.protocol,)
        if self.protocol.name not in allowed:
            raise UserError(
                f"collab train {self.method} rolls out on {' or '.join(allowed)}, "
                f"not '{self.protocol.name}'",
                "drop --protocol",
            )
        for key in self.trl:
            if key in MIRRORED_TRL_KEYS:
                field = MIRRORED_TRL_KEYS[key]
                raise UserError(
                    f"trl.{key} is collab train's {field}: the rollout reads it too",
                    f"set {field} instead (--set {field}=VALUE)",
                )
        self.lora.check_targets(self.model)  # last: it reads the model's config.json

    def check_eval_steps(self) -> None:
        """Evaluation during training needs a held-out set, and a method whose policy
        alone is evaluated (its spec says: rSIM scores its planner's start and end, not
        between)."""
        if self.eval_steps is None:
            return
        require("eval_steps", self.eval_steps, self.eval_steps >= 1, "at least 1")
        if self.eval_data is None:
            raise UserError("eval_steps needs a held-out set", "pass --eval-data NAME")
        if not methods.get(self.method).eval_steps:
            raise UserError(
                f"eval_steps is not offered for {self.method} (its policy is not evaluated "
                "alone between the start and the end)",
                "drop --eval-steps; --eval-data scores the start and the end",
            )

    def check_relay_reward(self) -> None:
        """The relay reward's settings: known values, and none the chosen reward ignores."""
        scope, ratio = self.scenario_scope, self.call_ratio
        require("scenario_scope", scope, scope in SCENARIO_SCOPES, " or ".join(SCENARIO_SCOPES))
        require("call_ratio", ratio, ratio in CALL_RATIOS, " or ".join(CALL_RATIOS))
        require("tokens_per_call", self.tokens_per_call, self.tokens_per_call >= 1, "at least 1")
        defaults = GRPOTrainConfig()
        if scope != defaults.scenario_scope and self.reward != "difficulty_aware":
            raise UserError(
                "scenario_scope is read by the difficulty_aware reward only",
                "drop it, or set reward=difficulty_aware",
            )
        if self.tokens_per_call != defaults.tokens_per_call and ratio != "per_call":
            raise UserError(
                "tokens_per_call is read with call_ratio per_call only",
                "drop it, or set call_ratio=per_call",
            )

    def check_rewards(self) -> None:
        """`replace` has a reward function to replace with (that each loads is checked
        on the trainer side, `grpo_args.check_run`: loading runs the user's module)."""
        if self.reward_mode not in ("add", "replace"):
            raise UserError(f"unknown reward_mode '{self.reward_mode}'", "use add or replace")
        if self.reward_mode == "replace" and not self.reward_funcs:
            raise UserError("reward_mode replace needs reward_funcs", "pass --reward-func")


# Bounds on what a value may allocate: completions generated per step and process (the
# rollout's batch holds them all), and optimizer steps.
MAX_ROLLOUT = 2**16
MAX_STEPS = 10**7


def others_fields(method: str) -> dict[str, str]:
    """Field -> a method that reads it, of the fields that methods' specs claim
    (`MethodSpec.fields`) and `method` does not read: its run refuses them set and leaves
    them out of config.yaml."""
    own = set(methods.get(method).fields)
    return {name: spec.name for spec in methods.specs() for name in spec.fields if name not in own}


def check_method_fields(config: GRPOTrainConfig) -> None:
    """Refuse a setting the run's method does not read (`train grpo --set reward=simple`
    would otherwise train as if it were never given)."""
    defaults = GRPOTrainConfig()
    for name, owner in others_fields(config.method).items():
        for key in changed_keys(getattr(config, name), getattr(defaults, name), name):
            raise UserError(
                f"{key} is read by collab train {owner} only, not {config.method}",
                f"drop it, or run collab train {owner}",
            )


def changed_keys(value: Any, default: Any, key: str) -> list[str]:
    """The dotted keys at which `value` differs from `default`."""
    if dataclasses.is_dataclass(value):
        return [
            changed
            for f in dataclasses.fields(value)
            for changed in changed_keys(
                getattr(value, f.name), getattr(default, f.name), f"{key}.{f.name}"
            )
        ]
    return [] if value == default else [key]


def grpo_protocols() -> tuple[str, ...]:
    """The protocols `collab train grpo` may roll out on, as their specs say: solo, apollo
    (tool-integrated RL, tool output masked) and any registered protocol that allows it."""
    return tuple(name for name in registry.names() if registry.get(name).grpo)


# Resources and bookkeeping: a resumed run may change them.
RESUMABLE_KEYS = frozenset(
    {
        *("out", "resume", "report_to", "engine", "steps", "save_steps", "save_rollouts"),
        *("eval_data", "eval_split", "eval_limit", "eval_steps"),
    }
)


# TRL's GRPOConfig arguments that are a run's own fields: TRL reads the argument and the
# rollout (or the run folder, the schedules) the field, so the field alone sets both and
# the trl block may not contradict it.
MIRRORED_TRL_KEYS = {
    "max_steps": "steps",
    "num_generations": "sampling.n",
    "max_completion_length": "sampling.max_tokens",
    "temperature": "sampling.temperature",
    "top_p": "sampling.top_p",
    "top_k": "sampling.top_k",
    "learning_rate": "learning_rate",
    "beta": "beta",
    "seed": "seed",
    "save_total_limit": "save_total_limit",
}
