"""What cuts a GRPO step's time and memory on this CPU: micro-batches and LoRA, side by side.

The step is the relay evidence step of docs/results.md: the relay warm-up policy,
4 problems × 8 samples of at most 64 tokens, the `reference@0.7` teacher. Each setting
trains a few steps with `collab train relay`, in a process of its own so that its peak
resident memory is its own:

- `full`: all weights, the step's 32 completions in one micro-batch (the evidence runs);
- `full/8`: all weights, micro-batches of 8 completions (gradient accumulation of 4);
- `lora`: a LoRA adapter (the `lora:` defaults, r 16) in one micro-batch;
- `lora/8`: the adapter in micro-batches of 8.

`--prompts`, `--generations`, `--max-tokens` and `--micro-batch` (the `/8` settings'
micro-batch) change those sizes, for a smoke run.

The settings alternate `--rounds` times. Per setting it prints the median of TRL's
`step_time` over the steps after the first, the rollout's share of it
(`episodes/rollout_seconds`), the peak resident memory, and both as ratios to `full`.

    python bench/step_cost.py --model runs/evidence/relay/sft/final \\
        --data runs/evidence/relay/train.jsonl
    python bench/step_cost.py --model smollm2-135m --steps 2 --rounds 1 --prompts 1 \\
        --generations 2 --max-tokens 8 --micro-batch 1                     # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = ("full", "full/8", "lora", "lora/8")


def setting_args(setting: str, args: argparse.Namespace) -> list[str]:
    """The `collab train` options of `setting`: `/8` splits the step's completions into
    micro-batches of `--micro-batch` (gradient accumulation over the rest)."""
    extra = ["--lora"] if setting.startswith("lora") else []
    if setting.endswith("/8"):
        completions = args.prompts * args.generations
        extra += [
            *("--set", f"trl.per_device_train_batch_size={args.micro_batch}"),
            *("--set", f"trl.gradient_accumulation_steps={completions // args.micro_batch}"),
        ]
    return extra


def run(setting: str, args: argparse.Namespace) -> dict[str, float]:
    """Train `args.steps` steps under `setting`: median step and rollout seconds of the
    steps after the first, and the process's peak resident memory in GB."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            *(sys.executable, "-m", "collabrl", "train", "relay"),
            *("--model", args.model, "--data", args.data, "--teacher", "reference@0.7"),
            *("--set", "prompt=plain", "--steps", str(args.steps)),
            *("--prompts-per-step", str(args.prompts), "--num-generations", str(args.generations)),
            *("--max-tokens", str(args.max_tokens), "--temperature", "0.7"),
            *("--lr", "2e-5", "--set", "seed=0", "--out", out, *setting_args(setting, args)),
        ]
        log = Path(out) / "stderr.log"
        with log.open("wb") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
            # wait4 gives this child's own rusage: ru_maxrss is its peak resident set, in KB.
            _, status, usage = os.wait4(process.pid, 0)
        if status != 0:
            sys.exit(f"{setting} failed:\n{log.read_text(errors='replace')[-2000:]}")
        lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    steps = [row for row in map(json.loads, lines) if "step_time" in row][1:]
    return {
        "step": statistics.median(row["step_time"] for row in steps),
        "rollout": statistics.median(row["episodes/rollout_seconds"] for row in steps),
        "peak_gb": usage.ru_maxrss / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/evidence/relay/sft/final")
    parser.add_argument("--data", default="runs/evidence/relay/train.jsonl")
    parser.add_argument("--steps", type=int, default=4, help="steps per run (first dropped)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the settings")
    # The evidence step's sizes; smaller ones make a smoke run.
    parser.add_argument("--prompts", type=int, default=4, help="problems per step")
    parser.add_argument("--generations", type=int, default=8, help="samples per problem")
    parser.add_argument("--max-tokens", type=int, default=64, help="max completion tokens")
    parser.add_argument("--micro-batch", type=int, default=8, help="the /8 settings' micro-batch")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is dropped)")
    if (args.prompts * args.generations) % args.micro_batch:
        parser.error("--micro-batch must divide --prompts × --generations")

    results: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for round_ in range(args.rounds):
        for name in SETTINGS:
            result = run(name, args)
            results[name].append(result)
            print(
                f"round {round_} · {name}: step {result['step']:.1f} s (rollout "
                f"{result['rollout']:.1f} s), peak {result['peak_gb']:.1f} GB",
                flush=True,
            )
    medians = {
        name: {key: statistics.median(r[key] for r in found) for key in found[0]}
        for name, found in results.items()
    }
    header = ("step s", "rollout s", "peak GB", "step", "peak")
    print(f"\n{'setting':<8} " + " ".join(f"{h:>9}" for h in header))
    full = medians["full"]
    for name, m in medians.items():
        print(
            f"{name:<8} {m['step']:>9.1f} {m['rollout']:>9.1f} {m['peak_gb']:>9.1f} "
            f"{m['step'] / full['step']:>8.2f}x {m['peak_gb'] / full['peak_gb']:>8.2f}x"
        )


if __name__ == "__main__":
    main()
