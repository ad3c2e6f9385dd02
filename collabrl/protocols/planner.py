"""Planners of the `strategy` protocol: who picks the next strategy, for a batch at once.

- `RSIMPlanner`: the rSIM planner (appendix A.3) — a causal LM whose final hidden state
  at the last token goes through a linear action head of 9 outputs, one per strategy.
  It is an `nn.Module` the trainer optimises (`forward`, `log_probs`).
- `PromptingPlanner`: the paper's Planner Prompting baseline — an LLM (local or at a
  URL) is asked to name the next strategy; a reply naming none becomes `continuation`,
  with the error recorded.
- PS+ prompting has no planner: `StrategyProtocol` runs it with `planner=None`.

Every planner sees only a `PlannerContext`: the question and f_obs of the finished steps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from collabrl.config import EngineConfig
from collabrl.engines import create_engine, is_url
from collabrl.engines.base import ChatMessage, Engine, SamplingParams
from collabrl.errors import UserError
from collabrl.protocols.strategies import PlannerContext
from collabrl.strategies import CONTINUATION, STRATEGIES, STRATEGY_NAMES

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

PLANNER_FILE = "planner.json"
HEAD_FILE = "action_head.safetensors"
BACKBONE_DIR = "backbone"


@dataclass(frozen=True)
class PlannerChoice:
    """The strategy picked for one context."""

    index: int  # into STRATEGIES
    probs: tuple[float, ...] | None = None  # the distribution it was drawn from (rsim)
    # log of the chosen action's probability under that distribution (rsim): the
    # old log-prob of the planner's policy-gradient ratio.
    logprob: float | None = None
    reply: str | None = None  # the prompted LLM's raw reply (prompting)
    error: str | None = None  # why the reply named no strategy (index is then the fallback)


class Planner(Protocol):
    """Picks one strategy per context, for a whole batch in one call."""

    def choose(
        self, contexts: list[PlannerContext], seeds: Sequence[int] = ()
    ) -> list[PlannerChoice]:
        """One choice per context, in order; `seeds`, one per context, makes each draw
        reproducible on its own, whatever batch it is in (empty: unseeded)."""
        ...

    def close(self) -> None:
        """Release the planner's engine or model."""
        ...


# -- rSIM ------------------------------------------------------------------------------


def planner_text(context: PlannerContext) -> str:
    """The rsim planner's input: the question, the observed steps, then the question asked.

    It ends on "Next strategy:", so the last token — whose hidden state the action head
    reads — sits where the choice is to be made.
    """
    lines = [f"Question: {context.question}"]
    lines += [f"Step {i}: {step}" for i, step in enumerate(context.steps, 1)]
    lines.append("Next strategy:")
    return "\n".join(lines)


def sample_rows(probs: torch.Tensor, seeds: Sequence[int] = ()) -> torch.Tensor:
    """One draw per row of `probs` [B, 9]: row i from a generator of its own, seeded with
    `seeds[i]`, so a draw depends on its row alone, not on the rows beside it (empty
    `seeds`: torch's global generator)."""
    if not seeds:
        return torch.multinomial(probs, 1).squeeze(-1)
    if len(seeds) != len(probs):
        raise ValueError(f"seeds: one per context, got {len(seeds)} for {len(probs)}")
    draws = [
        torch.multinomial(row, 1, generator=torch.Generator().manual_seed(seed))
        for row, seed in zip(probs, seeds, strict=True)
    ]
    return torch.cat(draws)


class RSIMPlanner(nn.Module):
    """A causal-LM backbone and a `Linear(hidden_size, 9)` action head on its last token."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        backbone_ref: str | None = None,
        temperature: float = 1.0,
        head_seed: int = 0,
        batch_size: int = 16,
        masked: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        if tokenizer.pad_token_id is None:
            raise ValueError("the planner tokenizer needs a pad token (see models.load_tokenizer)")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.backbone_ref = backbone_ref  # what `save` writes when the backbone is not saved
        self.temperature = temperature
        self.batch_size = batch_size
        # Strategies removed from the options (rSIM Table 5): never sampled, probability 0.
        self.masked = tuple(masked)
        hidden = backbone.config.get_text_config().hidden_size
        # A seeded head that leaves the caller's random state alone.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(head_seed)
            head = nn.Linear(hidden, len(STRATEGIES))
        weight = next(backbone.parameters())
        self.head = head.to(device=weight.device, dtype=weight.dtype)

    @classmethod
    def from_ref(
        cls,
        ref: str,
        temperature: float = 1.0,
        head_seed: int = 0,
        dtype: str = "float32",
        device: str = "cpu",
        masked: tuple[int, ...] = (),
    ) -> RSIMPlanner:
        """A backbone model reference (see `collabrl.models`) with a fresh, seeded head."""
        from collabrl.models import load_model, load_tokenizer

        backbone = load_model(ref, dtype=dtype, device=device)
        path = Path(ref).expanduser()
        portable = str(path.resolve()) if path.exists() else ref  # an embedded name stays
        return cls(backbone, load_tokenizer(ref), portable, temperature, head_seed, masked=masked)

    # -- scores ------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Action logits [B, 9] from left-padded ids: the last position is the last token."""
        # Positions count real tokens only, so a row scores the same whatever its padding.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.backbone.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )
        return self.head(out.last_hidden_state[:, -1])

    def checkpoint_layers(self, kwargs: dict[str, Any] | None = None) -> None:
        """Recompute each backbone layer in the backward pass instead of keeping its
        activations (`kwargs`: torch.utils.checkpoint's, as the trainer's for the policy).

        transformers checkpoints a layer only in training mode, and the planner stays
        in eval mode (no dropout, so a step's first ratio is exactly 1): only the
        checkpointed layers themselves are flagged as training, the modules inside them
        (attention, dropout) stay in eval. A later `eval()` undoes it."""
        from transformers.modeling_layers import GradientCheckpointingLayer

        enable = getattr(self.backbone, "activation_checkpointing_enable", None)
        if enable is not None:  # transformers >= 5.20's name
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            self.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        for module in self.backbone.modules():
            if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
                module.training = True

    def encode(self, contexts: list[PlannerContext]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded input ids and attention mask of the contexts, on the model's device."""
        batch = self.tokenizer(
            [planner_text(c) for c in contexts],
            padding=True,
            padding_side="left",
            return_tensors="pt",
        )
        device = self.head.weight.device
        return batch["input_ids"].to(device), batch["attention_mask"].to(device)

    def logits(self, contexts: list[PlannerContext]) -> torch.Tensor:
        """Action logits [B, 9], computed `batch_size` contexts at a time."""
        parts = [
            self(*self.encode(contexts[start : start + self.batch_size]))
            for start in range(0, len(contexts), self.batch_size)
        ]
        return torch.cat(parts)

    def action_log_probs(self, logits: torch.Tensor, actions: list[int]) -> torch.Tensor:
        """Log-probability [B] of `actions` under the policy of `logits` [B, 9] (a trainer
        computes the logits itself, through its distributed wrapper of this module)."""
        logp = self.policy_log_probs(logits)
        index = torch.tensor(actions, device=logp.device).unsqueeze(-1)
        return logp.gather(-1, index).squeeze(-1)

    def policy_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [B, 9] of the sampling distribution: softmax(logits / T) over
        the strategies not masked; temperature 0 (argmax) scores with the plain softmax."""
        logits = logits.float()
        if self.temperature > 0:
            logits = logits / self.temperature
        if self.masked:
            masked = torch.tensor(self.masked, device=logits.device)
            logits = logits.index_fill(-1, masked, -torch.inf)
        return torch.log_softmax(logits, dim=-1)

    @torch.inference_mode()
    def choose(
        self, contexts: list[PlannerContext], seeds: Sequence[int] = ()
    ) -> list[PlannerChoice]:
        if not contexts:
            return []
        logp = self.policy_log_probs(self.logits(contexts)).cpu()
        probs = logp.exp()
        picks = probs.argmax(-1) if self.temperature == 0 else sample_rows(probs, seeds)
        chosen = logp.gather(-1, picks.unsqueeze(-1)).squeeze(-1)
        return [
            PlannerChoice(index, tuple(row), logprob)
            for index, row, logprob in zip(
                picks.tolist(), probs.tolist(), chosen.tolist(), strict=True
            )
        ]

    def close(self) -> None:
        """Nothing to release: the weights go with the object."""

    # -- storage -----------------------------------------------------------------------

    def save(self, folder: str | Path, with_backbone: bool = False) -> None:
        """Write `planner.json` and `action_head.safetensors` (and the backbone, if asked).

        Without the backbone the folder refers to `backbone_ref`, which is right for an
        untrained backbone; a trained one must be saved with it.
        """
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if with_backbone:
            self.backbone.save_pretrained(folder / BACKBONE_DIR)
            self.tokenizer.save_pretrained(folder / BACKBONE_DIR)
        elif self.backbone_ref is None:
            raise ValueError("this planner's backbone has no reference: save it with_backbone")
        head = {k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}
        save_file(head, str(folder / HEAD_FILE))
        meta = {
            "backbone": BACKBONE_DIR if with_backbone else self.backbone_ref,
            "backbone_saved": with_backbone,
            "strategies": list(STRATEGY_NAMES),
            "hidden_size": self.head.in_features,
        }
        (folder / PLANNER_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(
        cls,
        folder: str | Path,
        temperature: float = 1.0,
        dtype: str = "float32",
        device: str = "cpu",
        masked: tuple[int, ...] = (),
    ) -> RSIMPlanner:
        """A planner saved by `save`: its backbone and the very same action head."""
        from safetensors.torch import load_file

        folder = Path(folder)
        try:
            meta = json.loads((folder / PLANNER_FILE).read_text())
            backbone, saved, hidden = meta["backbone"], meta["backbone_saved"], meta["hidden_size"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(
                f"{folder / PLANNER_FILE} is not a planner description ({err!r})",
                "pass a folder written by RSIMPlanner.save",
            ) from err
        if tuple(meta.get("strategies", ())) != STRATEGY_NAMES:
            raise UserError(
                f"the planner in {folder} chooses among other strategies: {meta.get('strategies')}",
                f"an rsim planner here must use {', '.join(STRATEGY_NAMES)}",
            )
        ref = str(folder / backbone) if saved else backbone
        planner = cls.from_ref(ref, temperature, dtype=dtype, device=device, masked=masked)
        if planner.head.in_features != hidden:
            raise UserError(
                f"the planner in {folder} has a head for hidden size {hidden}, "
                f"but its backbone {ref} has {planner.head.in_features}"
            )
        planner.head.load_state_dict(load_file(str(folder / HEAD_FILE)))
        return planner


# -- planner prompting -----------------------------------------------------------------

_PLANNER_SYSTEM = (
    "You are the planner of a step-by-step problem solver. Before each step, you choose "
    "the reasoning strategy the solver uses next."
)


def planner_messages(context: PlannerContext) -> list[ChatMessage]:
    """The prompted planner's chat: the problem, the steps so far, the numbered strategies."""
    steps = "\n".join(f"Step {i}: {s}" for i, s in enumerate(context.steps, 1)) or "(none yet)"
    options = "\n".join(f"{i}. {s.name}: {s.description}" for i, s in enumerate(STRATEGIES, 1))
    user = (
        f"Problem:\n{context.question}\n\nSteps so far:\n{steps}\n\nStrategies:\n{options}\n\n"
        "Which strategy should the next step use? Reply with its name or number only."
    )
    return [{"role": "system", "content": _PLANNER_SYSTEM}, {"role": "user", "content": user}]


def _name_pattern(*words: str) -> str:
    return r"[\s_-]*".join(map(re.escape, words))


# Each strategy's name, written with spaces, hyphens or underscores, and the paper's
# other names for two of them (section 3.2).
_NAME_RES: tuple[tuple[int, re.Pattern[str]], ...] = tuple(
    (STRATEGY_NAMES.index(name), re.compile(rf"\b{pattern}\b", re.IGNORECASE))
    for name, pattern in [
        *((n, _name_pattern(*re.split(r"[-\s]", n))) for n in STRATEGY_NAMES),
        ("deep thinking", _name_pattern("deliberative", "thinking")),
        ("terminal", "termination"),
    ]
)
# A number 1-9 standing alone: not part of a longer number or a decimal.
_NUMBER_RE = re.compile(r"(?<![\w.])([1-9])(?!\d|\.\d)")


def parse_strategy(reply: str) -> int | None:
    """The strategy a reply names, or None.

    The earliest strategy name wins (case-insensitive, any of space, hyphen or underscore
    between words); with no name, the first number 1-9 standing alone is read as the
    strategy's position in the prompt's list. Names go first because a reply about a
    maths problem is full of numbers that are not choices.
    """
    found = [(m.start(), index) for index, pattern in _NAME_RES if (m := pattern.search(reply))]
    if found:
        return min(found)[1]
    number = _NUMBER_RE.search(reply)
    return int(number.group(1)) - 1 if number else None


class PromptingPlanner:
    """An LLM asked, in words, for the next strategy (the Planner Prompting baseline)."""

    def __init__(self, engine: Engine, temperature: float = 0.0, max_tokens: int = 24) -> None:
        self.engine = engine
        self.temperature = temperature
        self.max_tokens = max_tokens  # a name or a number; chattier replies are cut

    def choose(
        self, contexts: list[PlannerContext], seeds: Sequence[int] = ()
    ) -> list[PlannerChoice]:
        if not contexts:
            return []
        params = SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, seeds=tuple(seeds)
        )
        try:
            groups = self.engine.generate([planner_messages(c) for c in contexts], params)
        except Exception as exc:  # a planner that is down must not end a run: go on unguided
            error = f"planner unavailable ({str(exc)[:200]}); continuation used"
            return [PlannerChoice(CONTINUATION, error=error) for _ in contexts]
        return [self._choice(group[0].text) for group in groups]

    @staticmethod
    def _choice(reply: str) -> PlannerChoice:
        index = parse_strategy(reply)
        if index is None:
            error = "the reply names no strategy; continuation used"
            return PlannerChoice(CONTINUATION, reply=reply, error=error)
        return PlannerChoice(index, reply=reply)

    def close(self) -> None:
        self.engine.close()


# -- from a config ---------------------------------------------------------------------


def load_planner(
    ref: str | None,
    kind: str,
    temperature: float,
    head_seed: int,
    engine: EngineConfig,
    masked: tuple[int, ...] = (),
) -> Planner:
    """The planner of `kind` (rsim or prompting), from a reference.

    rsim: a folder written by `RSIMPlanner.save`, or a backbone model reference (which
    gets a fresh head seeded with `head_seed`); prompting: a model reference or a URL,
    built with `engine` (its `chat_template_kwargs` included). `masked`: strategies the
    rsim planner may not choose.
    """
    if kind == "ps+":
        raise ValueError("the ps+ baseline has no planner")
    if not ref:
        raise UserError(f"the {kind} planner needs a model", "pass --planner MODEL_OR_URL")
    if kind == "prompting":
        return PromptingPlanner(create_engine(ref, engine), temperature=temperature)
    if is_url(ref):  # the strategy spec's check refuses it first, for the commands
        raise UserError(
            f"an rsim planner runs in-process and cannot be reached at {ref}",
            "pass a planner folder or a model reference, or --planner-kind prompting",
        )
    options = {"temperature": temperature, "dtype": engine.dtype, "masked": masked}
    if (Path(ref).expanduser() / PLANNER_FILE).is_file():
        return RSIMPlanner.load(Path(ref).expanduser(), device=engine.device, **options)
    return RSIMPlanner.from_ref(ref, head_seed=head_seed, device=engine.device, **options)
