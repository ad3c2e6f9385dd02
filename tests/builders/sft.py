"""One TRL SFTTrainer step on a builder's rows: the proof that they load as they are."""

from __future__ import annotations

from pathlib import Path


def train_one_step(rows, model_dir: Path, out: Path):
    """Train the tiny model for one step on `rows` (a `datasets.Dataset`); the trainer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(out),
        max_steps=1,
        per_device_train_batch_size=2,
        bf16=False,  # on a CPU bf16 makes a step ~10x slower
        report_to=[],
        save_strategy="no",
        use_cpu=True,
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=args,
        train_dataset=rows,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    # Conversational prompt-completion: the loss covers the completion only (TRL folds
    # the completion mask into the labels, -100 on the prompt).
    labels = trainer.train_dataset[0]["labels"]
    assert labels[0] == -100 and labels[-1] != -100
    assert trainer.train().training_loss > 0
    return trainer
