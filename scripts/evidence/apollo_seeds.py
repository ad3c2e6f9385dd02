"""AlphaApollo's comparisons across seeds (docs/results.md), from the folders
`scripts/reproduce.sh apollo` writes under OUT:

    python scripts/evidence/apollo_seeds.py OUT evolve SEED...
    python scripts/evidence/apollo_seeds.py OUT grpo SEED...

prints these markdown tables:

1. evolve, `collab evolve` (OUT/evolve-seedS/state.json): each selection rule's accuracy on the
   last round per seed (score, vote, verified: the final answer chosen by summed review
   scores, by majority, and by majority of the candidates whose re-run code agrees with
   their answer); then, for each pair of rules, the pooled test: each
   problem's right-or-wrong averaged over the seeds, a two-sided sign test over the
   problems, and the share of seeds where the first rule is higher;
2. grpo, GRPO with the python tool against the tool-less control from the same warm-up policy
   (OUT/rl/grpo-seedS and OUT/rl/grpo-alone-seedS, their greedy held-out `eval-final`):
   pass@1 per seed, the start (`eval-start`, greedy, so once an arm), and the same pooled
   sign test over the problems.

Every rule and arm is graded by each problem's own rule (`Item.is_correct`, numbers for
arith), the one `collab evolve` and `collab eval` apply.
"""

from __future__ import annotations

import json
import sys
from itertools import combinations
from pathlib import Path

from collabrl.data.benchmarks import load_benchmark
from collabrl.errors import UserError
from collabrl.eval.metrics import sign_test
from collabrl.eval.report import format_p, format_value, load_run, samples_by_item, to_markdown

RULES = ("score", "vote", "verified")
ARMS = {"tools": "grpo", "alone": "grpo-alone"}  # arm: run folder prefix under OUT/rl

Scores = dict[str, float]  # problem id -> right (1.0) or wrong (0.0)


def evolve_scores(out: Path, seed: str) -> dict[str, Scores]:
    """Each rule's right-or-wrong per problem on the evolve run's last round."""
    state = out / f"evolve-seed{seed}" / "state.json"
    if not state.is_file():
        raise UserError(f"{state} is missing: the evolve run of seed {seed} has not finished")
    last = json.loads(state.read_text())["rounds"][-1]["selected"]
    items = {item.id: item for item in load_benchmark(str(out / "test.jsonl")).items}
    return {
        rule: {pid: float(items[pid].is_correct(answers[rule])) for pid, answers in last.items()}
        for rule in RULES
    }


def arm_scores(run: Path) -> Scores:
    """Each problem's first sample right or wrong (greedy held-out: one sample)."""
    loaded = load_run(run)
    return {item: float(samples[0]["correct"]) for item, samples in samples_by_item(loaded).items()}


def mean(scores: Scores) -> float:
    return sum(scores.values()) / len(scores) if scores else 0.0


def pooled(first: list[Scores], second: list[Scores]) -> list[str]:
    """Per-problem difference (first − second) averaged over seeds; sign test over problems.
    Only problems every seed scored on both sides count."""
    shared = set.intersection(*(set(a) & set(b) for a, b in zip(first, second, strict=True)))
    means = [
        sum(a[p] - b[p] for a, b in zip(first, second, strict=True)) / len(first) for p in shared
    ]
    gained, lost = sum(m > 0 for m in means), sum(m < 0 for m in means)
    higher = sum(mean(a) > mean(b) for a, b in zip(first, second, strict=True))
    diff = sum(means) / len(means) if means else 0.0
    return [
        str(len(means)),
        format_value(diff),
        str(gained),
        str(lost),
        format_p(sign_test(gained, lost)),
        f"{higher}/{len(first)}",
    ]


POOLED = [
    "problems",
    "mean difference",
    "first higher",
    "second higher",
    "sign test p",
    "seeds first > second",
]


def evolve_tables(out: Path, seeds: list[str]) -> str:
    per_seed = [evolve_scores(out, seed) for seed in seeds]
    rows = [
        [seed, *(format_value(mean(scores[rule])) for rule in RULES)]
        for seed, scores in zip(seeds, per_seed, strict=True)
    ]
    pairs = [
        [f"{a} vs {b}", *pooled([s[a] for s in per_seed], [s[b] for s in per_seed])]
        for a, b in combinations(reversed(RULES), 2)
    ]
    return "\n\n".join(
        [
            to_markdown(["seed", *(f"selected by {rule}" for rule in RULES)], rows),
            to_markdown(["rules (first vs second)", *POOLED], pairs),
        ]
    )


def grpo_tables(out: Path, seeds: list[str]) -> str:
    runs = {
        arm: [out / "rl" / f"{prefix}-seed{seed}" for seed in seeds] for arm, prefix in ARMS.items()
    }
    start = {arm: arm_scores(folders[0] / "eval-start") for arm, folders in runs.items()}
    final = {
        arm: [arm_scores(run / "eval-final") for run in folders] for arm, folders in runs.items()
    }
    rows = [["start (warm-up policy)", *(format_value(mean(start[arm])) for arm in ARMS)]]
    rows += [
        [f"seed {seed}", *(format_value(mean(final[arm][i])) for arm in ARMS)]
        for i, seed in enumerate(seeds)
    ]
    return "\n\n".join(
        [
            to_markdown(["held-out pass@1", "GRPO with the tool", "GRPO alone (control)"], rows),
            to_markdown(
                ["arms (first vs second)", *POOLED],
                [["tools vs alone", *pooled(final["tools"], final["alone"])]],
            ),
        ]
    )


PARTS = {"evolve": evolve_tables, "grpo": grpo_tables}


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] not in PARTS:
        sys.exit(__doc__)
    try:
        print(PARTS[sys.argv[2]](Path(sys.argv[1]), sys.argv[3:]))
    except UserError as err:  # a run not finished yet: one line, no traceback
        sys.exit(f"error: {err}")
