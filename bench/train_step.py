"""GRPO step time: a relay or eapo step against a plain grpo step at equal tokens.

Each pair trains the same policy for a few steps twice: once with the `solo` protocol
(`collab train grpo`) and once with the collaborative one (`relay` with a teacher, or
`eapo` with experts), on the same problems, batch, token budget and seed. A step's cost
is TRL's own `step_time` (rollout, rewards, loss and update) divided by the response
tokens of the step (`completions/mean_length` × batch: the policy's tokens plus the
teacher's or experts' text in its context), so a protocol that writes more tokens is
not charged for them; the ratio is that per-token cost over grpo's. The first step of
each run is dropped (warm-up); methods alternate `--rounds` times and medians are
reported, with the plain step-time ratio beside the per-token one, and each run's
generation time (`episodes/rollout_seconds`) apart from the rest of its step. The policy
should have had the warm-up (`collab train sft` on `collab
build-warmup relay|consult` rows), or it never calls and the ratio says nothing: the
calls per episode are printed beside it.

    python bench/train_step.py --relay-model runs/sft-relay/final \
        --eapo-model runs/sft-consult/final
    python bench/train_step.py --relay-model smollm2-135m --steps 2 --rounds 1   # smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collabrl.config import DecodingConfig  # noqa: E402
from collabrl.protocols.config import ProtocolConfig  # noqa: E402
from collabrl.train.grpo import train_grpo  # noqa: E402
from collabrl.train.grpo_config import GRPOTrainConfig  # noqa: E402
from collabrl.train.resolve import resolve_run  # noqa: E402

TARGET = 1.5


def run(method: str, model: str, helper: str, args: argparse.Namespace) -> dict[str, float]:
    """Train `args.steps` steps; the per-token step cost and calls of steps 2.."""
    protocol = ProtocolConfig()
    if method == "relay":
        protocol.teacher = helper
    if method == "eapo":
        protocol.experts = [helper]
    with tempfile.TemporaryDirectory() as out:
        config = GRPOTrainConfig(
            method=method,
            model=model,
            data=args.data,
            limit=args.limit,
            out=out,
            steps=args.steps,
            prompts_per_step=args.prompts,
            sampling=DecodingConfig(
                n=args.generations, max_tokens=args.max_tokens, temperature=1.0
            ),
            learning_rate=1e-6,
            save_steps=10**6,
            protocol=protocol,
        )
        config.engine.batch_size = args.prompts * args.generations
        history = [h for h in train_grpo(resolve_run(config)).history if "step_time" in h][1:]
    batch = args.prompts * args.generations
    return {
        "seconds_per_token": statistics.median(
            h["step_time"] / (h["completions/mean_length"] * batch) for h in history
        ),
        "step_time": statistics.median(h["step_time"] for h in history),
        "tokens": statistics.median(h["completions/mean_length"] * batch for h in history),
        "calls": statistics.mean(h.get("episodes/calls", 0.0) for h in history),
        "rollout": statistics.median(h["episodes/rollout_seconds"] for h in history),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--relay-model", help="policy of the relay pair (a relay warm-up)")
    parser.add_argument("--eapo-model", help="policy of the eapo pair (a consult warm-up)")
    parser.add_argument("--helper", default="smollm2-135m", help="teacher and experts")
    parser.add_argument("--data", default="arith_train")
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4, help="steps per run (first dropped)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the methods")
    parser.add_argument("--prompts", type=int, default=4, help="problems per step")
    parser.add_argument("--generations", type=int, default=4, help="samples per problem")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is dropped)")
    pairs = [
        (method, model)
        for method, model in (("relay", args.relay_model), ("eapo", args.eapo_model))
        if model
    ]
    if not pairs:
        parser.error("give --relay-model and/or --eapo-model")

    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for method, model in pairs:
            for name in ("grpo", method):
                result = run(name, model, args.helper, args)
                results.setdefault((method, name), []).append(result)
                print(
                    f"round {round_} · {method} pair · {name}: step {result['step_time']:.1f} s, "
                    f"{result['tokens']:.0f} tokens, {result['calls']:.2f} calls/episode, "
                    f"{1000 * result['seconds_per_token']:.1f} ms/token; rollout "
                    f"{result['rollout']:.1f} s, the rest (loss, backward, update) "
                    f"{result['step_time'] - result['rollout']:.1f} s",
                    flush=True,
                )
    print(
        f"\n{'pair':<6} {'grpo ms/token':>14} {'method ms/token':>16} {'ratio':>6} "
        f"{'step ratio':>10} calls/episode"
    )
    for method, _ in pairs:
        base, ours = results[(method, "grpo")], results[(method, method)]
        per_token = median_of(ours, "seconds_per_token") / median_of(base, "seconds_per_token")
        per_step = median_of(ours, "step_time") / median_of(base, "step_time")
        calls = statistics.mean(r["calls"] for r in ours)
        verdict = "met" if per_token <= TARGET else "missed"
        print(
            f"{method:<6} {1000 * median_of(base, 'seconds_per_token'):>14.1f} "
            f"{1000 * median_of(ours, 'seconds_per_token'):>16.1f} {per_token:>5.2f}x "
            f"{per_step:>9.2f}x {calls:.2f}   (target <= {TARGET}x per token: {verdict})"
        )


def median_of(results: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in results)


if __name__ == "__main__":
    main()
