"""The dry run's memory estimate against the measured peak of real training steps, on this CPU.

For each method (grpo; relay with the `reference` teacher stand-in; eapo with `reference`
experts; rsim with the small model as its planner) and each of two tiny random Llama
widths (`small` ≈ 12 M and `large` ≈ 57 M parameters, the SmolLM2 tokenizer), it:

1. writes the run's config and asks `plan_run` (what `collab train --dry-run` prints) for
   its "training total", with max_prompt_tokens set to the longest prompt of the data so
   that the plan's sequence is the run's (prompt + max_tokens);
2. trains 2 steps with `collab train` in a child process (2, so that AdamW's moments
   exist during the second step's backward, as in every later step) and reads its peak
   resident memory (wait4's ru_maxrss);
3. subtracts a baseline child that imports the same libraries (torch, transformers, TRL,
   collabrl's trainer) and loads the tokenizer, but holds no model and trains nothing.

What is comparable: the estimate counts what training holds at its peak (weights,
gradients, AdamW, the reference model, saved activations, TRL's LM-head tiles, the
planner's state); on a CPU the run computes in fp32 and folds the head's tiles with torch
ops, and the plan says so (bf16 off, no Triton), so both sides are fp32. What is not:
the measured side also holds what the estimate leaves out: the rollout's generation
(KV cache; done before the loss, so it overlaps only through the allocator's retained
pages), safetensors' file pages while a model loads, AdamW's foreach temporaries during
`step()`, Python objects, and the allocator's fragmentation. rsim's planner activations
are counted where rSIM's `memory_beside` (train/methods/rsim.py) counts them.

    OMP_NUM_THREADS=1 .venv/bin/python bench/memory_estimate.py             # all, ~10 min
    OMP_NUM_THREADS=1 .venv/bin/python bench/memory_estimate.py --methods grpo --sizes small
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

# Measured / estimated within this band counts as agreeing (see docs/benchmarks.md).
TOLERANCE = (0.7, 1.5)
SIZES = {
    "small": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=6,
                  num_key_value_heads=2, intermediate_size=768),
    "large": dict(hidden_size=512, num_hidden_layers=10, num_attention_heads=8,
                  num_key_value_heads=4, intermediate_size=1536),
}  # fmt: skip
# The methods' protocols and betas (as their paper configs: relay 0.01, rsim 0.04).
METHODS = {
    "grpo": dict(beta=0.04),
    "relay": dict(beta=0.01, protocol={"teacher": "reference"}),
    # One expert answering in 16 tokens: a full consult turn (one call, its answer and
    # the final answer, consult.turn_tokens) fits the 96-token episode.
    "eapo": dict(
        beta=0.0,
        protocol={"experts": ["reference"], "consult": {"num_experts": 1, "expert_max_tokens": 16}},
    ),
    "rsim": dict(beta=0.04, protocol={"planner": "SMALL", "strategy": {"max_steps": 2}}),
}
BASELINE = (
    "import torch, transformers, trl, accelerate, datasets\n"
    "import collabrl.train.trainer, collabrl.train.grpo, collabrl.train.rsim_trainer\n"
    "from collabrl.models import load_tokenizer\n"
    "load_tokenizer({model!r})\n"
)


@dataclass
class Result:
    method: str
    size: str
    parameters: float  # millions
    estimate: float  # GiB, the plan's training total
    measured: float  # GiB, peak RSS of the run minus the baseline's

    @property
    def ratio(self) -> float:
        return self.measured / self.estimate


def write_model(folder: Path, size: str) -> Path:
    """A random tiny Llama of `size` with the SmolLM2 tokenizer, written as the tests
    write theirs (tests/conftest.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests/
    from collabrl.models import load_tokenizer
    from tests.conftest import write_tiny_llama

    return write_tiny_llama(load_tokenizer("smollm2-135m"), folder, **SIZES[size])


def run_config(method: str, model: Path, small: Path, out: Path, args: argparse.Namespace) -> dict:
    settings = dict(METHODS[method])
    protocol = dict(settings.pop("protocol", {}))
    if protocol.get("planner") == "SMALL":
        protocol["planner"] = str(small)
    return {
        "method": method,
        "model": str(model),
        "data": "arith_train",
        "limit": 16,
        "steps": 2,
        "prompts_per_step": args.prompts,
        "sampling": {"n": args.generations, "max_tokens": args.max_tokens},
        "protocol": protocol,
        "seed": 0,
        "out": str(out),
        **settings,
    }


def estimate(config: dict) -> tuple[float, float]:
    """The plan's training total (GiB) and the policy's parameters (millions), for the
    run's own sequence: max_prompt_tokens is the data's longest prompt."""
    from collabrl.config import build_config
    from collabrl.data.benchmarks import Fields, load_benchmark
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.memory import model_shape
    from collabrl.train.plan import plan_run
    from collabrl.train.prompt_length import prompt_lengths
    from collabrl.train.resolve import resolve_run

    cfg = build_config(GRPOTrainConfig, [config])
    bench = load_benchmark(cfg.data, Fields.of(cfg), cfg.limit)
    longest = max(prompt_lengths(resolve_run(cfg), bench))
    cfg = build_config(GRPOTrainConfig, [config, {"max_prompt_tokens": longest}])
    rows = {k: v for section in plan_run(resolve_run(cfg)).sections.values() for k, v in section}
    shape = model_shape(cfg.model)
    assert shape is not None
    return float(rows["training total"].split()[0]), shape.parameters / 1e6


def peak_gib(command: list[str], log: Path) -> float:
    """Run `command` and return its peak resident memory; exits on failure."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        # wait4 gives this child's own rusage: ru_maxrss is its peak resident set, in KiB.
        _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        sys.exit(f"{' '.join(command[:6])} failed:\n{log.read_text(errors='replace')[-3000:]}")
    return usage.ru_maxrss * 1024 / 1024**3


def measure(method: str, size: str, models: dict[str, Path], work: Path, args) -> Result:
    out = work / f"{method}-{size}"
    config = run_config(method, models[size], models["small"], out / "run", args)
    out.mkdir()
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    planned, parameters = estimate(config)
    train = [sys.executable, "-m", "collabrl", "train", method, "-c", str(path)]
    peak = peak_gib(train, out / "train.log")
    base = peak_gib(
        [sys.executable, "-c", BASELINE.format(model=str(models[size]))], out / "base.log"
    )
    return Result(method, size, parameters, planned, peak - base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--prompts", type=int, default=2, help="problems per step")
    parser.add_argument("--generations", type=int, default=4, help="G")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sizes = args.sizes.split(",")
        models = {s: write_model(work / f"model-{s}", s) for s in {"small", *sizes}}
        for size in sizes:
            for method in args.methods.split(","):
                result = measure(method, size, models, work, args)
                results.append(result)
                print(
                    f"{method} · {size}: estimate {result.estimate:.2f} GiB, measured "
                    f"{result.measured:.2f} GiB, ratio {result.ratio:.2f}",
                    flush=True,
                )
    low, high = TOLERANCE
    print(
        f"\n{'method':<6} {'size':<6} {'params M':>8} {'estimate':>9} {'measured':>9} {'ratio':>6}"
    )
    for r in results:
        flag = "" if low <= r.ratio <= high else "  outside tolerance"
        print(
            f"{r.method:<6} {r.size:<6} {r.parameters:>8.1f} {r.estimate:>8.2f}G "
            f"{r.measured:>8.2f}G {r.ratio:>6.2f}{flag}"
        )
    print(f"tolerance: measured / estimate in [{low}, {high}]")
    if any(not low <= r.ratio <= high for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
