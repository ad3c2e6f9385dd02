"""`collab train sft`: RelayLLM's warm-up stage (§3.1) on TRL's SFTTrainer.

The policy is fine-tuned with cross-entropy on the warm-up rows (`collab build-warmup
relay`), conversational prompt–completion pairs, with the loss on the completion only: it
learns the syntax of `<call>n</call>` before GRPO teaches it when to call.

The paper gives no warm-up hyperparameters (its appendix E lists GRPO's only), so the
defaults are those of the authors' released launch, github.com/Chengsong-Huang/RelayLLM
`main.bash` running `SFT_stage/train.py`: full fine-tuning, learning rate 2e-5, one
epoch, 2 rows per device × 16 accumulation steps (32 per update, App. E's global batch
size too), a 3% linear warm-up of the learning rate, sequences cut at 4096 tokens, and a
loss masked to the response.

The run folder holds `config.yaml`, `metrics.jsonl` (every TRL log, one line each),
`train_curves.png`, `checkpoints/` (TRL's, for `--resume`) and `final/`: a plain Hugging
Face folder (a LoRA run's adapter merged into the base weights), itself a model reference
(`collabrl.train.run`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from collabrl import runs
from collabrl.config import option
from collabrl.devices import check_dtype
from collabrl.errors import MissingInput, UserError, require
from collabrl.models import load_model, load_tokenizer, resolve_model
from collabrl.train.checkpoints import checkpoint_step
from collabrl.train.compat import checkpointing_args
from collabrl.train.final import save_final
from collabrl.train.lora import RENAMED_LORA_KEYS, LoraSettings
from collabrl.train.model_card import (
    TrainingFacts,
    batches,
    keep_trl_card_out,
    learning_rate_settings,
    lora_setting,
    write_model_card,
)
from collabrl.train.run import (
    CHECKPOINTS,
    CURVES,
    FINAL,
    METRICS,
    check_trl_keys,
    plot_curves,
    quiet_trl_notices,
    recorder,
    started_run,
    trl_args,
)
from collabrl.train.trackers import check_report_to, trackers

if TYPE_CHECKING:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

# How long the run goes, its memory use and where it reports may change on --resume (`--set
# trl.max_steps=N` extends a run); the model, data, LoRA and learning settings may not.
RESUMABLE_KEYS = frozenset(
    {
        "out",
        "resume",
        "activation_checkpointing",
        "report_to",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "trl",
    }
)


@dataclass
class SFTTrainConfig:
    """Supervised fine-tuning on prompt–completion rows (RelayLLM's warm-up, §3.1)."""

    model: str = option("smollm2-135m", "The policy to fine-tune: a model reference.")
    data: str | None = option(
        None,
        "Training rows: a builder folder (collab build-warmup; its dataset/), a datasets "
        "folder, or a rows .jsonl; conversational prompt/completion columns.",
    )
    out: str | None = option(
        None, "Run folder (default: a new folder under runs/); refused if it holds another run."
    )
    resume: bool = option(
        False, "Continue from the last checkpoint in OUT/checkpoints (after a kill, or longer)."
    )
    lora: LoraSettings = option(
        LoraSettings(merge=True),
        "A LoRA adapter instead of all weights (the authors fine-tune all); final/ holds it "
        "merged into the base weights unless lora.merge is false.",
    )
    learning_rate: float = option(2e-5, "Peak learning rate (the authors' main.bash: 2e-5).")
    epochs: float = option(1.0, "Passes over the rows (the authors' train.py: 1).")
    batch_size: int = option(2, "Rows per device per step (the authors' main.bash: 2).")
    gradient_accumulation_steps: int = option(
        16, "Steps accumulated per update (main.bash: 16, so 32 rows per update on one GPU)."
    )
    warmup_ratio: float = option(
        0.03, "Fraction of the updates over which the learning rate warms up (train.py: 0.03)."
    )
    max_length: int = option(
        4096, "Tokens kept of prompt + completion; longer rows are cut (main.bash: 4096)."
    )
    seed: int = option(0, "Seed of the LoRA init, data order and dropout.")
    activation_checkpointing: bool = option(
        True, "Recompute activations in the backward pass: less memory, slower (train.py: on)."
    )
    save_strategy: str = option("steps", "When checkpoints are saved: steps | epoch.")
    save_steps: int = option(100, "Updates between checkpoints (save_strategy steps).")
    save_total_limit: int | None = option(
        2, "Checkpoints kept (older ones deleted); none keeps them all."
    )
    chat_template_kwargs: dict[str, Any] = option(
        {},
        "Options of the chat template the rows are rendered with, e.g. {enable_thinking: "
        "false} for Qwen3's non-thinking mode: the warm-up must render prompts as the RL "
        "run and collab eval do (engine.chat_template_kwargs there).",
    )
    final_dtype: str = option(
        "auto",
        "Weights dtype of final/: auto (as trained: float32 master weights), bfloat16, "
        "float16, float32.",
    )
    report_to: str = option(
        "none",
        "Experiment tracking, as TRL's report_to: none, tensorboard, wandb, trackio, or "
        "several joined by commas; the run folder keeps metrics.jsonl and its curves either way.",
    )
    trl: dict[str, Any] = option(
        {},
        "Any other TRL SFTConfig argument, applied last (e.g. --set trl.max_steps=100, "
        "trl.lr_scheduler_type=constant).",
    )

    RENAMED: ClassVar[dict[str, str]] = RENAMED_LORA_KEYS

    def check(self) -> None:
        """Refuse values no run can use, before any data or model is loaded."""
        if not self.data:
            raise MissingInput(
                "collab train sft needs data",
                "pass --data: a builder folder, a datasets folder or a rows .jsonl",
            )
        require("learning_rate", self.learning_rate, 0 < self.learning_rate < 1, "in (0, 1)")
        require("epochs", self.epochs, 0 < self.epochs < math.inf, "a finite number > 0")
        require("batch_size", self.batch_size, self.batch_size >= 1, "at least 1")
        check_report_to(self.report_to)
        require(
            "gradient_accumulation_steps",
            self.gradient_accumulation_steps,
            self.gradient_accumulation_steps >= 1,
            "at least 1",
        )
        require("warmup_ratio", self.warmup_ratio, 0 <= self.warmup_ratio < 1, "in [0, 1)")
        require("max_length", self.max_length, self.max_length >= 1, "at least 1")
        require("seed", self.seed, 0 <= self.seed < 2**32, "between 0 and 2^32 - 1")
        require(
            "save_strategy", self.save_strategy, self.save_strategy in ("steps", "epoch"), "steps"
        )
        require("save_steps", self.save_steps, self.save_steps >= 1, "at least 1")
        limit = self.save_total_limit
        require("save_total_limit", limit, limit is None or limit >= 1, "at least 1 or none")
        self.lora.check()
        check_dtype(self.final_dtype, "final_dtype")
        from trl import SFTConfig

        check_trl_keys(self.trl, SFTConfig)
        self.lora.check_targets(self.model)  # last: it reads the model's config.json


@dataclass(frozen=True)
class SFTResult:
    """A finished (or resumed) run: its folder and what it reached."""

    out_dir: Path
    metrics: dict[str, Any]  # steps, final_loss, train_loss, resumed_from, final


def train_sft(
    config: SFTTrainConfig,
    progress: Callable[[int, int], None] | None = None,
    report: Callable[[str], None] | None = None,
) -> SFTResult:
    """Fine-tune `config.model` on `config.data` into the run folder; see the module
    docstring. `progress(done, total)` is called with optimizer steps, `report` with a
    line per logged step."""
    import transformers

    config.check()
    quiet_trl_notices()
    ref = resolve_model(config.model)
    rows = with_template_options(load_rows(config.data or ""), config.chat_template_kwargs)
    out = runs.out_folder(config.out, "sft", config.data or "", config.model)
    with started_run(config, out, RESUMABLE_KEYS) as last:
        tokenizer = load_tokenizer(ref)
        if tokenizer.chat_template is None:
            raise UserError(
                f"model '{config.model}' has no chat template; the rows are conversational",
                "use an instruct model, or add a chat_template to its tokenizer_config.json",
            )
        transformers.set_seed(config.seed)  # the LoRA init happens before the trainer seeds
        with _quiet_datasets(), runs.RecordWriter(out / METRICS) as writer:
            trainer = _trainer(config, rows, load_model(ref), tokenizer, out)  # tokenizes rows
            trainer.add_callback(recorder(writer, progress, report))
            output = trainer.train(resume_from_checkpoint=last)
    resumed_from = checkpoint_step(last) if last else None
    save_final(trainer, out / FINAL, config.lora, config.final_dtype)
    if trainer.is_world_process_zero():
        write_model_card(out / FINAL, sft_facts(config, len(rows), trainer.state.global_step))
    history = runs.read_records(out / METRICS)
    names = f"{Path(config.model.rstrip('/')).name} on {Path(config.data or '').name}"
    plot_curves(history, out / CURVES, ("loss",), f"SFT · {names}")
    losses = [r["loss"] for r in history if "loss" in r]
    return SFTResult(
        out,
        {
            "steps": trainer.state.global_step,
            "final_loss": losses[-1] if losses else None,
            "train_loss": output.training_loss,
            "resumed_from": resumed_from,
            "final": str(out / FINAL),
        },
    )


def load_rows(data: str) -> Dataset:
    """The training rows of a builder folder (its dataset/), a datasets folder or a .jsonl."""
    import datasets

    path = Path(data).expanduser()
    if (path / runs.DATASET).is_dir():
        path = path / runs.DATASET
    if path.is_file() and path.suffix == ".jsonl":
        rows = _from_jsonl(path)
    elif path.is_dir():
        try:
            rows = datasets.load_from_disk(str(path))
        except FileNotFoundError as err:
            raise UserError(
                f"{data} is neither a builder folder nor a datasets folder",
                "pass a collab build-warmup folder, a datasets folder or a rows .jsonl",
            ) from err
        if isinstance(rows, datasets.DatasetDict):
            if "train" not in rows:
                raise UserError(f"{data} has no train split", "save the rows as a train split")
            rows = rows["train"]
    else:
        raise UserError(
            f"no training rows at {data}",
            "pass a collab build-warmup folder, a datasets folder or a rows .jsonl",
        )
    missing = {"prompt", "completion"} - set(rows.column_names)
    if missing:
        raise UserError(
            f"{data} has no {' or '.join(sorted(missing))} column "
            f"(columns: {', '.join(rows.column_names)})",
            "train on prompt/completion rows, e.g. from collab build-warmup relay",
        )
    if len(rows) == 0:
        raise UserError(f"{data} holds no rows", "build some first: collab build-warmup relay")
    return rows


def with_template_options(rows: Dataset, options: dict[str, Any]) -> Dataset:
    """`rows` with `options` in each row's `chat_template_kwargs` (a row's own keys win),
    which TRL's SFTTrainer passes to the chat template of that row."""
    if not options:
        return rows

    def add(row: dict[str, Any]) -> dict[str, Any]:
        return {"chat_template_kwargs": {**options, **(row.get("chat_template_kwargs") or {})}}

    return rows.map(add)


def _from_jsonl(path: Path) -> Dataset:
    """Rows read as the builders export them (`Dataset.from_list`)."""
    import datasets
    import pyarrow as pa

    try:
        return datasets.Dataset.from_list(runs.read_records(path))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise UserError(f"{path}: rows of mixed shapes ({err})", "fix or rebuild the rows") from err


def sft_args(config: SFTTrainConfig, checkpoints: Path) -> SFTConfig:
    """TRL's arguments: the config's settings, then `config.trl` over them."""
    import torch
    from trl import SFTConfig

    cuda = torch.cuda.is_available()
    args: dict[str, Any] = {
        "output_dir": str(checkpoints),
        "learning_rate": config.learning_rate,
        "num_train_epochs": config.epochs,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "warmup_steps": config.warmup_ratio,  # below 1, TRL reads it as a ratio
        "max_length": config.max_length,
        "seed": config.seed,
        "completion_only_loss": True,  # the prompt is the problem, not what is learned
        "save_strategy": config.save_strategy,
        "save_steps": config.save_steps,
        "save_total_limit": config.save_total_limit,
        "logging_steps": 1,
        "report_to": trackers(config.report_to),
        "disable_tqdm": True,  # the command draws its own bar
        "use_cpu": not cuda,
        # bf16 mixed precision on a GPU that has it; on a CPU it makes a step ~10x slower.
        "bf16": cuda and torch.cuda.is_bf16_supported(),
    }
    # The trl block may name the switch either way; it wins over activation_checkpointing.
    trl = checkpointing_args(config.trl, default=config.activation_checkpointing)
    return trl_args(SFTConfig, {**args, **trl})


def sft_facts(config: SFTTrainConfig, rows: int, steps: int) -> TrainingFacts:
    """The card of a `collab train sft` run, its settings read off its TRL arguments."""
    args = sft_args(config, Path("checks-only"))  # the values only: nothing is written
    settings = {
        **learning_rate_settings(args),
        "epochs": config.epochs,
        "micro-batch × accumulation": batches(args),
        "max length (tokens)": args.max_length,
        "LoRA": lora_setting(config.lora),
        "seed": config.seed,
    }
    return TrainingFacts(
        base_model=config.model,
        method="sft",
        data=config.data or "",
        rows=rows,
        steps=steps,
        settings=settings,
        adapter=config.lora.enabled and not config.lora.merge,
    )


def _trainer(
    config: SFTTrainConfig, rows: Dataset, model: Any, tokenizer: Any, out: Path
) -> SFTTrainer:
    from transformers import PrinterCallback
    from trl import SFTTrainer

    trainer = SFTTrainer(
        model=model,
        args=sft_args(config, out / CHECKPOINTS),
        train_dataset=rows,
        processing_class=tokenizer,
        peft_config=config.lora.peft_config(),
    )
    trainer.remove_callback(PrinterCallback)  # metrics.jsonl has every log
    keep_trl_card_out(trainer)
    return trainer


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """datasets' bars (the trainer tokenizing the rows) would print under the command's own."""
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()
