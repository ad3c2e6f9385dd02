"""Decode-step cost by batch size and context length: the ceiling of batched decoding.

One KV-cached decode step of the model is timed at each batch size and context, on
transformers' default cache (what `generate`, hence eval_throughput.py's per-sample
loop, uses) and on the continuous engine's growing cache. With every row useful,
batching B rows can at best reach

    ceiling(B) = B * t_default(1) / t_growing(B)

times the loop's tokens/s: an upper bound for eval_throughput.py's ratios at that
context. Rounds interleave the two caches and every size; medians are reported.

    python bench/decode_step.py                                  # contexts 156 and 600
    python bench/decode_step.py --contexts 300 --batch-sizes 1,16 --rounds 2
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval_throughput import step_profile  # noqa: E402

from collabrl.models import load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--contexts", default="156,600", help="comma-separated cache lengths")
    parser.add_argument("--batch-sizes", default="1,8,16,32")
    parser.add_argument("--steps", type=int, default=16, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("command: python " + shlex.join(sys.argv))
    model = load_model(args.model)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    for context in (int(c) for c in args.contexts.split(",")):
        default, growing = {}, {}
        for _ in range(args.rounds):  # one round of each per call: alternate the caches
            for cache, times in ((False, default), (True, growing)):
                for b, t in step_profile(
                    model, sizes, context, args.steps, 1, growing=cache
                ).items():
                    times.setdefault(b, []).append(t)
        base = sorted(default[1])[len(default[1]) // 2]
        print(f"\ncontext {context}: ms per decode step (median of {args.rounds} rounds)")
        print("  batch   default cache   growing cache   ceiling B*t_default(1)/t_growing(B)")
        for b in sorted(default):
            d = sorted(default[b])[len(default[b]) // 2]
            g = sorted(growing[b])[len(growing[b]) // 2]
            print(f"  {b:5d}   {d * 1000:13.1f}   {g * 1000:13.1f}   {b * base / g:8.2f}x")


if __name__ == "__main__":
    main()
