"""The model card (`final/README.md`) every training run leaves beside its model.

A Hugging Face model card: YAML front matter the Hub reads (base_model, library_name,
tags, license) and a body saying what was trained, from what, on what data, for how many
steps, with which settings, how it scored on the held-out set, with which collabrl, and
how to load it. The folder can be uploaded as it is (`hf upload USER/NAME OUT/final`).

Written with huggingface_hub's `ModelCard`, `ModelCardData` and `EvalResult`, offline.
The Hub checks the front matter when a card is pushed, so it holds only what is valid
there: `base_model` only when the run started from a Hub repo (a hub name, or an embedded
model, named by the repo it was quantized from; a local folder is named in the body
instead), `license` only when the base model states one (an embedded model's, or the card
of a local folder or a cached snapshot), `datasets` only for data copied from a Hub
dataset (`HUB_DATASETS`; the body names any data), and `model-index` with the held-out
scores of the trained model when the run evaluated one.

TRL's trainers write a draft card of their own into the checkpoints folder at every
save, its fields `[None]` where a run leaves TRL's hub settings unset:
`keep_trl_card_out` stops it, so `final/README.md` is the run's only card.

Every value the user gave (model, data, collaborators, paths) reaches the body on one
line and redacted (`collabrl.redact`: a teacher's URL may carry a password), as a code
span fenced past its own backticks, or escaped as Markdown text: a data path holding a
newline or markup must not add lines, links or tags to the card.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl import runs
from collabrl.redact import redact_text
from collabrl.train.held_out import LOGGED
from collabrl.train.methods import registry as methods

if TYPE_CHECKING:
    from collabrl.train.lora import LoraSettings
    from collabrl.train.resolve import ResolvedRun

CARD = "README.md"


@dataclass(frozen=True)
class TrainingFacts:
    """What the card says of a run."""

    base_model: str  # the model reference the run started from, as the user gave it
    method: str  # grpo, relay, eapo, rsim, sft
    data: str  # the training data, as the user gave it
    rows: int  # training problems (GRPO methods) or rows (SFT) after filtering
    steps: int  # optimizer steps trained
    settings: dict[str, Any]  # the key settings in the order shown
    adapter: bool = False  # final/ is a LoRA adapter (lora.merge false), not merged weights
    protocol: str | None = None
    collaborators: dict[str, list[str]] = field(default_factory=dict)  # role -> references
    eval_data: str | None = None
    evaluation: dict[str, dict[str, Any]] = field(default_factory=dict)  # eval.json


def write_model_card(final: Path, facts: TrainingFacts) -> Path:
    """Write `final/README.md` for `facts` (over any card already there: the one the
    trainer or an earlier write left); the card's path."""
    from huggingface_hub import ModelCard

    card = ModelCard(f"---\n{card_data(facts).to_yaml()}\n---\n\n{card_body(facts, final)}")
    path = final / CARD
    runs.write_atomic(path, str(card))  # as ModelCard.save writes it, but never half a card
    return path


# The Hub datasets the shipped data sets were copied from (data/README.md gives each one's
# provenance): the card's `datasets` and its model-index name them. The generated arith
# sets, and the benchmarks whose copies came from elsewhere, have none.
HUB_DATASETS = {
    "gsm8k": "openai/gsm8k",
    "gsm8k_train": "openai/gsm8k",
    "math500": "HuggingFaceH4/MATH-500",
    "math_train": "DigitalLearningGmbH/MATH-lighteval",
    "dapo_math_17k": "BytedTsinghua-SIA/DAPO-Math-17k",
}
# The held-out scores the model-index reports: the trained model's, not its answer length.
INDEXED = ("pass@1", "call_ratio")


def card_data(facts: TrainingFacts) -> Any:
    """The front matter: only values the Hub accepts (see the module docstring)."""
    from huggingface_hub import ModelCardData

    method_tags = methods.get(facts.method).tags
    dataset = HUB_DATASETS.get(facts.data)
    results = eval_results(facts)
    return ModelCardData(
        base_model=hub_repo(facts.base_model),
        datasets=None if dataset is None else [dataset],
        library_name="peft" if facts.adapter else "transformers",
        license=base_license(facts.base_model),
        tags=list(dict.fromkeys(["collabrl", "trl", *method_tags])),
        model_name=title(facts) if results else None,
        eval_results=results or None,
    )


def eval_results(facts: TrainingFacts) -> list[Any]:
    """The trained model's held-out scores (greedy, at the end of the run) as the Hub's
    model-index holds them; none when the run evaluated nothing."""
    from huggingface_hub import EvalResult

    final = facts.evaluation.get("final")
    if not (facts.eval_data and final):
        return []
    name = runs.one_line(redact_text(facts.eval_data))
    return [
        EvalResult(
            task_type="text-generation",
            dataset_type=HUB_DATASETS.get(facts.eval_data, name),
            dataset_name=name,
            metric_type=key,
            metric_name=f"{key} (greedy)",
            metric_value=final[key],
        )
        for key in INDEXED
        if key in final
    ]


def hub_repo(ref: str) -> str | None:
    """The Hub repository `ref` names (its revision left out) or an embedded model was
    made from; None for a local file or folder, or a URL."""
    from collabrl.models import EMBEDDED_MODELS, hub_name

    if ref in EMBEDDED_MODELS:
        return EMBEDDED_MODELS[ref].hub_repo
    hub = hub_name(ref)
    return None if hub is None else hub["repo"]


def base_license(base_model: str) -> str | None:
    """The license the base model states: an embedded model's own, or its card's where it
    is a local folder or a hub name's cached snapshot with one (none is looked up on the
    Hub)."""
    from huggingface_hub import ModelCard

    from collabrl.errors import UserError
    from collabrl.models import EMBEDDED_MODELS, hub_name, resolve_model

    if base_model in EMBEDDED_MODELS:
        return EMBEDDED_MODELS[base_model].license
    folder = Path(base_model).expanduser()
    if hub_name(base_model) is not None:
        try:
            folder = resolve_model(base_model).source
        except UserError:  # no longer in the cache: no license known
            return None
    readme = folder / CARD
    if not readme.is_file():
        return None
    try:
        return ModelCard.load(readme).data.to_dict().get("license")
    except Exception:  # a README that is not a model card: no license known
        return None


def card_body(facts: TrainingFacts, final: Path) -> str:
    """The card's text: what the run was, its settings, its scores, how to load it."""
    lines = [
        f"# {markdown_text(title(facts))}",
        "",
        f"{code(facts.base_model)} trained with collabrl "
        f"{runs.installed_versions()['collabrl']} "
        f"by {methods.get(facts.method).card or facts.method}.",
        "",
        "## Training",
        "",
        f"- Base model: {code(facts.base_model)}",
        f"- Method: {facts.method}" + (f", protocol {facts.protocol}" if facts.protocol else ""),
        *(
            f"- {role.capitalize()}: " + ", ".join(code(ref) for ref in refs)
            for role, refs in facts.collaborators.items()
        ),
        f"- Data: {code(facts.data)} ({facts.rows} {methods.get(facts.method).rows})",
        f"- Steps: {facts.steps} optimizer steps",
        "- Versions: " + ", ".join(f"{p} {v}" for p, v in runs.installed_versions().items()),
        "",
        "| setting | value |",
        "| --- | --- |",
        *(f"| {cell(key)} | {cell(value)} |" for key, value in facts.settings.items()),
        "",
        *score_lines(facts),
        "## Use",
        "",
        *load_lines(facts, final),
    ]
    return "\n".join(lines) + "\n"


def title(facts: TrainingFacts) -> str:
    """The card's heading and model-index name: the base model's name (a hub name's
    without its revision) and the method."""
    from collabrl.models import hub_name

    hub = hub_name(facts.base_model)
    base = hub["repo"] if hub is not None else redact_text(facts.base_model).rstrip("/")
    return runs.one_line(f"{Path(base).name or facts.base_model} · collabrl {facts.method}")


def keep_trl_card_out(trainer: Any) -> None:
    """Stop TRL's trainer writing its draft card into the checkpoints folder at each save
    (`_save_checkpoint` calls `create_model_card`): the run writes final/README.md."""

    def no_card(*args: Any, **kwargs: Any) -> None:
        """The card is the run's own, written once the model is final."""

    trainer.create_model_card = no_card


def score_lines(facts: TrainingFacts) -> list[str]:
    """The held-out table (start vs trained, greedy) and the paired change; a line
    saying there was none when the run evaluated nothing."""
    start, final = facts.evaluation.get("start"), facts.evaluation.get("final")
    if not (facts.eval_data and start and final):
        return ["## Evaluation", "", "No held-out evaluation ran (`--eval-data` unset).", ""]
    lines = [
        "## Evaluation",
        "",
        f"Held-out {code(facts.eval_data)}, greedy, the starting and the trained policy:",
        "",
        "| metric | start | trained |",
        "| --- | --- | --- |",
        *(
            f"| {key} | {start[key]:.4f} | {final[key]:.4f} |"
            for key in LOGGED
            if key in start and key in final
        ),
        "",
    ]
    paired = facts.evaluation.get("paired")
    if paired:
        lines += [
            f"Of {int(start.get('problems', 0))} problems: {paired['gained']} newly solved, "
            f"{paired['lost']} lost (sign test p = {paired['p_value']:.3g}).",
            "",
        ]
    return lines


def load_lines(facts: TrainingFacts, final: Path) -> list[str]:
    """How to load the folder: transformers (peft for an adapter), and collab."""
    model_class = "AutoPeftModelForCausalLM" if facts.adapter else "AutoModelForCausalLM"
    imports = (
        ["from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer"]
        if facts.adapter
        else ["from transformers import AutoModelForCausalLM, AutoTokenizer"]
    )
    # A JSON string is a Python string literal, on one line: a quote or newline in the
    # path neither ends the string nor the code block.
    path = json.dumps(str(final), ensure_ascii=False)
    return [
        "```python",
        *imports,
        "",
        f"model = {model_class}.from_pretrained({path})  # or its Hub repo id",
        f"tokenizer = AutoTokenizer.from_pretrained({path})",
        "```",
        "",
        "or as a collabrl model reference: "
        f"{code(f'collab eval BENCHMARK --model {shlex.quote(str(final))}')}.",
    ]


def code(value: str) -> str:
    """`value` as a Markdown code span: redacted, on one line, fenced by one backtick more
    than the longest run of them it holds (CommonMark), so it cannot close the span."""
    text = runs.one_line(redact_text(value))
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# What Markdown reads as markup in running text: emphasis, code, links, tags, tables.
MARKUP = re.compile(r"([\\`*_\[\]<>|])")


def markdown_text(value: str) -> str:
    """`value` as Markdown text: redacted, on one line, each markup character escaped."""
    return MARKUP.sub(r"\\\1", runs.one_line(redact_text(value)))


def cell(value: object) -> str:
    """A table cell: redacted, on one line, its `|` escaped so that the row keeps its columns
    (the rest stays readable: `num_generations`, not `num\\_generations`)."""
    return runs.one_line(redact_text(str(value))).replace("|", "\\|")


def grpo_facts(run: ResolvedRun, rows: int, steps: int, out: Path) -> TrainingFacts:
    """The card of a `collab train grpo|relay|eapo|rsim` run, its settings read off the
    TRL arguments it trained with (`grpo_args`: the trl block included)."""
    from collabrl.protocols.registry import served_collaborators
    from collabrl.train.grpo_args import grpo_args

    config = run.config
    args = grpo_args(config, out)
    collaborators: dict[str, list[str]] = {}
    for collaborator, ref in served_collaborators(run.protocol):
        collaborators.setdefault(collaborator.name, []).append(ref)
    for label, path in run.method.outputs(out).items():  # rsim: the planner trained beside it
        collaborators[label] = [path]
    settings = {
        **learning_rate_settings(args),
        "G (samples per problem, TRL num_generations)": args.num_generations,
        "problems per step": config.prompts_per_step,
        "micro-batch × accumulation": batches(args),
        "max tokens per episode": config.sampling.max_tokens,
        "temperature": config.sampling.temperature,
        "beta (KL)": args.beta,
        "loss": args.loss_type,
        "LoRA": lora_setting(config.lora),
        "seed": config.seed,
    }
    return TrainingFacts(
        base_model=config.model,
        method=config.method,
        data=config.data,
        rows=rows,
        steps=steps,
        settings=settings,
        adapter=config.lora.enabled and not config.lora.merge,
        protocol=config.protocol.name,
        collaborators=collaborators,
        eval_data=config.eval_data,
    )


def learning_rate_settings(args: Any) -> dict[str, Any]:
    """The rate, its schedule and its warm-up, as TRL's arguments hold them."""
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    settings: dict[str, Any] = {"learning rate": f"{args.learning_rate:g}, {schedule} schedule"}
    if args.warmup_steps:
        settings["warm-up"] = (
            f"{args.warmup_steps:g} of the updates"
            if args.warmup_steps < 1  # TRL reads a value below 1 as a ratio
            else f"{args.warmup_steps:g} steps"
        )
    return settings


def batches(args: Any) -> str:
    return f"{args.per_device_train_batch_size} × {args.gradient_accumulation_steps}"


def lora_setting(lora: LoraSettings) -> str:
    if not lora.enabled:
        return "off (all weights trained)"
    kept = "merged into the weights" if lora.merge else "the adapter alone"
    return f"r {lora.r}, alpha {lora.alpha:g}, {', '.join(lora.target_modules)}; {kept}"
