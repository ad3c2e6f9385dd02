"""A `collab train grpo` step against a bare `trl.GRPOTrainer` script, side by side.

The question a TRL user asks first: what does collab's machinery cost per training step?
Both sides train the same policy with GRPO on the same problems, with the same
settings, each in a fresh process of its own (so that the peak resident memory read
with `os.wait4` is that run's alone), and the runs alternate collab, trl, collab, trl, …
`--repeats` times:

- **collab**: `collab train grpo -c config.yaml`, the command itself (`collabrl.cli`'s
  `main`; the `solo` protocol, correctness reward). On top of what TRL does it adds:
  the rollout through the protocol (`rollout_func`): the policy samples through collab's
  `TransformersEngine` over the live weights (continuous batching, per-row KV caches,
  a per-episode seed) instead of TRL's `model.generate`; every completion becomes an
  Episode (segments by author, end reason, extracted answer, scored strictly and
  flexibly, a truncated episode's fallback answer unpaid); the episodes' extras reach
  the reward functions; the run folder (config.yaml, metrics.jsonl with the episodes'
  own metrics, the final model, the curves).
- **trl**: the script a TRL user would write: the same model folder loaded in float32,
  a dataset of chat prompts (the same messages collab's rollout renders: the data's
  prompt template) with their gold answers, one reward function, `GRPOTrainer(model,
  reward_funcs, args, train_dataset, processing_class).train()`. It generates with
  TRL's own `model.generate` path (no vLLM on a CPU). The reward function calls the
  same answer extraction and equivalence check as collab (`collabrl.rewards`), so
  that the reward's cost is not what differs.

Same on both sides: the model (the converted `--model` folder, float32 master
weights, no bf16 on a CPU), the first `--prompts × --steps` problems of `--data` (TRL's
sampler draws the same order from the same seed and dataset length), G
(`--generations`), `--max-tokens`, temperature, top-p 1, no top-k, learning rate, β,
seed, one optimizer step per generation batch, no gradient checkpointing (collab's
default; TRL's is on), no checkpoint saves during the steps.

A step's time is TRL's own `step_time` (rollout, rewards, loss, backward, update) as
both runs log it; the first step of each run is dropped (warm-up). Both processes time
TRL's `GRPOTrainer._generate` (`timed_generation`), which splits a step into sampling
and the rest alike on both sides. Sampling with different engines and stop rules
writes completions of different lengths, so the tokens generated per step (TRL's
`completions/mean_length` × batch) are reported beside the time, and the time per
generated token too; the ratio is collab / trl (goal: ≤ 1.05× per step).

    .venv/bin/python bench/grpo_vs_trl.py                        # smollm2-135m, 4 steps, 3 rounds
    .venv/bin/python bench/grpo_vs_trl.py --steps 2 --repeats 1 --max-tokens 16   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

TARGET = 1.05  # collab's step time over bare TRL's (issue 34)
SIDES = ("collab", "trl")
GENERATE_KEY = "bench/generate_seconds"  # logged by timed_generation on both sides


def timed_generation() -> None:
    """Log each step's sampling seconds as `bench/generate_seconds`, on either side.

    `GRPOTrainer._generate` is where both sides sample (collab through its
    `rollout_func`), so its time splits a step into generation and the rest (rewards,
    loss, backward, update) alike on both; TRL logs the metric with its own."""
    import time

    from trl import GRPOTrainer

    original = GRPOTrainer._generate

    def _generate(self, prompts):
        began = time.perf_counter()
        try:
            return original(self, prompts)
        finally:
            self._metrics["train"][GENERATE_KEY].append(time.perf_counter() - began)

    GRPOTrainer._generate = _generate


# -- the bare TRL side (runs in its own process) -----------------------------------


def trl_worker(spec: dict, out: Path) -> list[dict]:
    """Train with a plain `trl.GRPOTrainer`; returns TRL's log history."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from collabrl.rewards.extract import extract_answer
    from collabrl.rewards.verify import is_equivalent

    rows = [json.loads(line) for line in Path(spec["rows"]).read_text().splitlines()]
    extractors = spec["extractors"]

    def correctness(completions: list, answer: list[str], **_: object) -> list[float]:
        texts = [c[-1]["content"] for c in completions]
        return [
            float(is_equivalent(extract_answer(t, extractors), gold))
            for t, gold in zip(texts, answer, strict=True)
        ]

    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=spec["steps"],
        per_device_train_batch_size=spec["prompts"] * spec["generations"],
        num_generations=spec["generations"],
        max_completion_length=spec["max_tokens"],
        temperature=spec["temperature"],
        learning_rate=spec["learning_rate"],
        beta=spec["beta"],
        seed=spec["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,
        # TRL's default is on; `collab train` turns it off (on a CPU it only slows the
        # step), so the bare side does too: both compute the same backward.
        gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=correctness,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer.state.log_history


# -- the parent: data, configs, alternating runs -----------------------------------


def prepare(args: argparse.Namespace, work: Path) -> dict:
    """The shared model folder, the bare side's rows and both sides' settings."""
    from collabrl.data.benchmarks import Fields, load_benchmark
    from collabrl.data.prompts import get_prompt
    from collabrl.models import resolve_model, weights_dir

    # Both sides load the same Hugging Face folder (an embedded GGUF's converted copy).
    model = str(weights_dir(resolve_model(args.model)))
    bench = load_benchmark(args.data, Fields(), args.prompts * args.steps)
    template = get_prompt(bench.prompt)
    rows = work / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"prompt": template.messages(item.problem), "answer": item.answer}) + "\n"
            for item in bench.items
        )
    )
    return {
        "model": model,
        "data": args.data,
        "limit": len(bench.items),
        "rows": str(rows),
        "extractors": list(template.extractors(bench.extract_fallback)),
        "prompt": template.name,
        **{
            key: getattr(args, key)
            for key in (
                "steps",
                "prompts",
                "generations",
                "max_tokens",
                "temperature",
                "learning_rate",
                "beta",
                "seed",
            )
        },
    }


def collab_config(spec: dict, out: Path) -> dict:
    """`collab train grpo`'s config.yaml for the same run."""
    return {
        "method": "grpo",
        "model": spec["model"],
        "data": spec["data"],
        "limit": spec["limit"],
        "steps": spec["steps"],
        "prompts_per_step": spec["prompts"],
        "sampling": {
            "n": spec["generations"],
            "max_tokens": spec["max_tokens"],
            "temperature": spec["temperature"],
        },
        "learning_rate": spec["learning_rate"],
        "beta": spec["beta"],
        "seed": spec["seed"],
        "save_steps": 10**6,  # no checkpoint inside the timed steps (TRL: save_strategy no)
        "out": str(out),
    }


def run_side(side: str, spec: dict, work: Path, index: int) -> dict:
    """One run of `side` in a fresh process: per-step times and tokens, peak RSS."""
    folder = work / f"{side}-{index}"
    folder.mkdir()
    if side == "collab":
        config = folder / "config.yaml"
        config.write_text(yaml.safe_dump(collab_config(spec, folder / "run")))
        # `collab train grpo -c config.yaml`, with the sampling timer installed first.
        command = [sys.executable, __file__, "--collab-worker", str(config)]
    else:
        spec_file = folder / "spec.json"
        spec_file.write_text(json.dumps(spec))
        command = [sys.executable, __file__, "--worker", str(spec_file), "--out", str(folder)]
    log = folder / "log.txt"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        # wait4 gives this child's own rusage: ru_maxrss is its peak resident set, in KiB.
        _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        sys.exit(f"the {side} run failed:\n{log.read_text(errors='replace')[-3000:]}")
    history_file = folder / "run" / "metrics.jsonl" if side == "collab" else folder / "log.json"
    history = [json.loads(line) for line in history_file.read_text().splitlines()]
    steps = [h for h in history if "step_time" in h][1:]  # the first step is warm-up
    batch = spec["prompts"] * spec["generations"]
    return {
        "step_time": statistics.median(h["step_time"] for h in steps),
        "generate": statistics.median(h[GENERATE_KEY] for h in steps),
        "tokens": statistics.median(h["completions/mean_length"] * batch for h in steps),
        "per_token": statistics.median(
            h["step_time"] / (h["completions/mean_length"] * batch) for h in steps
        ),
        "reward": statistics.mean(h["reward"] for h in steps),
        "peak_gib": usage.ru_maxrss / 1024**2,
    }


def report(results: dict[str, list[dict]], spec: dict) -> None:
    pairs = list(zip(results["collab"], results["trl"], strict=True))
    step_ratios = [c["step_time"] / t["step_time"] for c, t in pairs]
    token_ratios = [c["per_token"] / t["per_token"] for c, t in pairs]
    print(
        f"\n{'side':<8}{'step s':>9}{'generate s':>12}{'rest s':>9}{'tokens/step':>13}"
        f"{'ms/token':>10}{'reward':>8}{'peak GiB':>10}"
    )
    for side in SIDES:
        found = results[side]
        step, generate = median(found, "step_time"), median(found, "generate")
        print(
            f"{side:<8}{step:>9.2f}{generate:>12.2f}{step - generate:>9.2f}"
            f"{median(found, 'tokens'):>13.0f}{1000 * median(found, 'per_token'):>10.2f}"
            f"{median(found, 'reward'):>8.3f}{median(found, 'peak_gib'):>10.2f}"
        )
    step, token = statistics.median(step_ratios), statistics.median(token_ratios)
    rss = median(results["collab"], "peak_gib") / median(results["trl"], "peak_gib")
    print(
        f"\nratio collab / trl per step: {step:.2f}x "
        f"(rounds: {', '.join(f'{r:.2f}x' for r in step_ratios)}; target <= {TARGET}x: "
        f"{'met' if step <= TARGET else 'missed'})"
    )
    print(
        f"ratio collab / trl per generated token: {token:.2f}x "
        f"(rounds: {', '.join(f'{r:.2f}x' for r in token_ratios)})"
    )
    print(f"ratio collab / trl peak RSS: {rss:.2f}x")


def median(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m", help="policy (default: smollm2-135m)")
    p.add_argument("--data", default="arith_train", help="training problems (arith_train)")
    p.add_argument("--steps", type=int, default=4, help="steps per run, first dropped (4)")
    p.add_argument("--repeats", type=int, default=3, help="alternations of the sides (3)")
    p.add_argument("--prompts", type=int, default=4, help="problems per step (4)")
    p.add_argument("--generations", type=int, default=4, help="G, samples per problem (4)")
    p.add_argument("--max-tokens", type=int, default=128, help="max completion tokens (128)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (1.0)")
    p.add_argument("--learning-rate", type=float, default=1e-6, help="AdamW lr (1e-6)")
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0.0)")
    p.add_argument("--seed", type=int, default=0, help="seed of both runs (0)")
    p.add_argument("--json", metavar="PATH", help="also write every run's numbers here")
    p.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    p.add_argument("--collab-worker", metavar="CONFIG", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be at least 2 (the first step is dropped)")
    return args


def main() -> int:
    args = parse_args()
    if args.collab_worker:  # the collab side: the command itself, in a process of its own
        from collabrl.cli import main as collab

        timed_generation()
        sys.argv = ["collab", "train", "grpo", "-c", args.collab_worker]
        return collab()
    if args.worker:  # the bare TRL side, in a process of its own
        timed_generation()
        history = trl_worker(json.loads(Path(args.worker).read_text()), Path(args.out))
        Path(args.out, "log.json").write_text("".join(json.dumps(h) + "\n" for h in history))
        return 0
    import torch
    import transformers
    import trl

    print(f"command: {shlex.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl "
        f"{trl.__version__}; {os.cpu_count()} CPU cores, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = prepare(args, work)
        print(
            f"model {args.model} (float32); first {spec['limit']} problems of {args.data}, "
            f"prompt '{spec['prompt']}'; {args.prompts} problems x G={args.generations} per "
            f"step, max {args.max_tokens} tokens, temperature {args.temperature}, lr "
            f"{args.learning_rate}, beta {args.beta}, seed {args.seed}; {args.steps} steps per "
            f"run (first dropped), {args.repeats} alternating rounds, medians reported"
        )
        for round_ in range(args.repeats):
            for side in SIDES:
                result = run_side(side, spec, work, round_)
                results[side].append(result)
                print(
                    f"  round {round_} · {side:<6}: step {result['step_time']:.2f} s "
                    f"(generation {result['generate']:.2f} s), "
                    f"{result['tokens']:.0f} tokens/step, "
                    f"{1000 * result['per_token']:.2f} ms/token, "
                    f"peak {result['peak_gib']:.2f} GiB",
                    flush=True,
                )
    report(results, spec)
    if args.json:
        Path(args.json).write_text(json.dumps({"spec": spec, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
