"""EAPO's pre-registered comparison across seeds (docs/results.md), from the run folders
`scripts/reproduce.sh eapo` writes under OUT:

    python scripts/evidence/eapo_seeds.py OUT SEED...

reads, for every seed, the Pass@32 evaluations of the EAPO run and of its GRPO baseline
(`OUT/{eapo,grpo}-seedS/eval-pass32`, `collab eval` folders) and the EAPO run's
metrics.jsonl and rollouts.jsonl, and prints these markdown tables:

1. per seed, EAPO's "Pass@32" (`f1@32`, the mean over problems of each problem's mean F1
   over 32 samples) and "Var" (`var_f1`, the population variance of those means) against
   the baseline's, and the share of seeds where EAPO is higher / its Var lower;
2. the pooled test: each held-out problem's F1 difference (EAPO − GRPO) averaged over the
   seeds, and a two-sided sign test over the problems (the problems are the independent
   draws; one problem's seeds are not);
3. EAPO's Figure 4, the consultation rate (`episodes/consult_rate`: the share of a step's
   episodes that sent at least one query) per window of 4 steps and seed;
4. why the rate moves or not, from the EAPO runs' rollouts.jsonl pooled over seeds, per
   window: the episodes that consulted against those that did not (right answers, mean
   reward, mean GRPO advantage: a positive advantage is what reinforces consulting), and
   the consulting episodes that had an expert answer let in by rho against those that
   had none; then the same per problem family over all steps. Only the episodes
   rollouts.jsonl kept count (`save_rollouts`).

It also draws the rate per step, each seed and their mean, into OUT/consult_rate.png.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.episode import Episode
from collabrl.errors import UserError
from collabrl.eval.metrics import sign_test
from collabrl.eval.report import format_p, format_value, load_run, samples_by_item, to_markdown
from collabrl.train.run import METRICS, ROLLOUTS

ARMS = ("eapo", "grpo")
EVAL = "eval-pass32"  # the folder of each run's Pass@32 evaluation
RATE = "episodes/consult_rate"
WINDOW = 4  # steps per row of the rate table: a step is only 16 episodes
FAMILY = re.compile(r"arith(?:_steps)?-\w+-(\w+)-")  # reproduce.sh's FAMILY


def problem_f1(run_dir: Path) -> dict[str, float]:
    """Each problem's mean F1 over its n samples (its Pass@32 at n = 32)."""
    run = load_run(run_dir)
    return {
        item: sum(float(s["f1"]) for s in samples) / len(samples)
        for item, samples in samples_by_item(run).items()
    }


def pass_and_var(run_dir: Path) -> tuple[float, float]:
    """EAPO's Pass@n (f1@n: 32 samples a problem in the pre-registered setting) and Var."""
    run = load_run(run_dir)
    return run["metrics"][f"f1@{run['n']}"], run["metrics"]["var_f1"]


def seed_table(out: Path, seeds: list[str]) -> tuple[list[str], list[list[str]]]:
    """Per seed: each arm's Pass@32 and Var, and whether EAPO is higher / steadier."""
    header = ["seed", "EAPO Pass@32", "GRPO Pass@32", "EAPO Var", "GRPO Var", "higher", "steadier"]
    rows, higher, steadier = [], 0, 0
    for seed in seeds:
        eapo, grpo = (pass_and_var(out / f"{arm}-seed{seed}" / EVAL) for arm in ARMS)
        up, low = eapo[0] > grpo[0], eapo[1] < grpo[1]
        higher, steadier = higher + up, steadier + low
        values = [eapo[0], grpo[0], eapo[1], grpo[1]]
        rows.append([seed, *map(format_value, values), str(up).lower(), str(low).lower()])
    rows.append(["share", "", "", "", "", f"{higher}/{len(seeds)}", f"{steadier}/{len(seeds)}"])
    return header, rows


def pooled_test(out: Path, seeds: list[str]) -> tuple[list[str], list[list[str]]]:
    """The per-problem F1 difference averaged over seeds, and its sign test."""
    diffs: dict[str, list[float]] = {}
    for seed in seeds:
        eapo, grpo = (problem_f1(out / f"{arm}-seed{seed}" / EVAL) for arm in ARMS)
        for item in eapo.keys() & grpo.keys():
            diffs.setdefault(item, []).append(eapo[item] - grpo[item])
    # Only problems every seed scored: a mean over fewer seeds would weigh them unevenly.
    means = [sum(d) / len(d) for d in diffs.values() if len(d) == len(seeds)]
    gained, lost = sum(m > 0 for m in means), sum(m < 0 for m in means)
    mean = sum(means) / len(means) if means else 0.0
    row = [str(len(means)), format_value(mean), str(gained), str(lost)]
    return ["problems", "mean F1 difference", "EAPO higher", "GRPO higher", "sign test p"], [
        [*row, format_p(sign_test(gained, lost))]
    ]


def consult_rates(run: Path) -> list[tuple[int, float]]:
    """(step, consultation rate) of every training step that logged one, in order."""
    by_step = {r["step"]: r[RATE] for r in runs.read_records(run / METRICS) if RATE in r}
    return sorted(by_step.items())


def rate_table(out: Path, seeds: list[str]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for seed in seeds:
        rates = consult_rates(out / f"eapo-seed{seed}")
        for start in range(0, len(rates), WINDOW):
            part = rates[start : start + WINDOW]
            mean = sum(rate for _, rate in part) / len(part)
            rows.append([seed, f"{part[0][0]}-{part[-1][0]}", format_value(mean)])
    return ["seed", "steps", "consultation rate"], rows


def plot_rates(out: Path, seeds: list[str], path: Path) -> None:
    """Figure 4: the rate per step, one thin line per seed and their mean."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    curves = {seed: dict(consult_rates(out / f"eapo-seed{seed}")) for seed in seeds}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for seed, curve in curves.items():
        ax.plot(list(curve), list(curve.values()), alpha=0.4, label=f"seed {seed}")
    steps = sorted(set.intersection(*(set(c) for c in curves.values())))
    mean = [sum(c[s] for c in curves.values()) / len(curves) for s in steps]
    ax.plot(steps, mean, color="black", linewidth=2, label="mean over seeds")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("training step (rollout generation)")
    ax.set_ylabel("share of episodes that consulted")
    ax.set_title("EAPO consultation rate during training (Figure 4)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


Record = dict[str, Any]


def logged_episodes(out: Path, seeds: list[str]) -> list[Record]:
    """The EAPO runs' logged training episodes, pooled over seeds."""
    records = []
    for seed in seeds:
        path = out / f"eapo-seed{seed}" / ROLLOUTS
        if not path.is_file():
            raise UserError(f"{path} is missing", "has the EAPO run trained (save_rollouts > 0)?")
        records += runs.read_records(path)
    return records


def steps(record: Record) -> str:
    """The window of steps a record falls in, as "5-8"."""
    start = (record["step"] - 1) // WINDOW * WINDOW + 1
    return f"{start}-{start + WINDOW - 1}"


def family(record: Record) -> str:
    match = FAMILY.search(record["episode"]["problem_id"])
    return match.group(1) if match else "(other)"


def natural(label: str) -> list[Any]:
    """Sorts "5-8" before "13-16": the numbers in a label as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]


def let_in(record: Record) -> bool:
    """Whether rho let at least one expert answer into this episode."""
    calls = Episode.from_dict(record["episode"]).calls
    return any(call.meta.get("accepted", False) for call in calls)


def summary_cells(records: list[Record]) -> list[str]:
    """Right answers (right/of), the mean reward and the mean advantage of some episodes."""
    if not records:
        return ["0/0", "-", "-"]
    right = sum(bool(r["correct"]) for r in records)
    means = (sum(float(r[key]) for r in records) / len(records) for key in ("reward", "advantage"))
    return [f"{right}/{len(records)}", *map(format_value, means)]


def why_table(
    out: Path, seeds: list[str], by: Callable[[Record], str] = steps
) -> tuple[list[str], list[list[str]]]:
    """Per window of steps (or family, `by`): the episodes that consulted against those
    that did not, and among the consulting ones, those rho let an answer in against not."""
    groups: dict[str, list[Record]] = defaultdict(list)
    for record in logged_episodes(out, seeds):
        groups[by(record)].append(record)
    header = [by.__name__, "episodes", "consulted"]
    for group in ("consulted", "did not", "answer let in", "none let in"):
        header += [f"{group}: right", f"{group}: reward", f"{group}: advantage"]
    rows = []
    for label in sorted(groups, key=natural):
        records = groups[label]
        consulted = [r for r in records if r["calls"] > 0]
        answered: dict[bool, list[Record]] = {True: [], False: []}
        for record in consulted:
            answered[let_in(record)].append(record)
        alone = [r for r in records if r["calls"] == 0]
        row = [label, str(len(records)), str(len(consulted))]
        for group in (consulted, alone, answered[True], answered[False]):
            row += summary_cells(group)
        rows.append(row)
    return header, rows


def main(out: Path, seeds: list[str]) -> None:
    for title, (header, rows) in (
        ("Pass@32 and Var per seed", seed_table(out, seeds)),
        ("Pooled over seeds", pooled_test(out, seeds)),
        ("Consultation rate (Figure 4)", rate_table(out, seeds)),
        ("Why: the logged training episodes, pooled over seeds", why_table(out, seeds)),
        ("Why, by family (all steps)", why_table(out, seeds, by=family)),
    ):
        print(f"\n**{title}**\n\n{to_markdown(header, rows)}")
    plot_rates(out, seeds, out / "consult_rate.png")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    try:
        main(Path(sys.argv[1]), sys.argv[2:])
    except UserError as err:  # a run not finished yet: one line, no traceback
        sys.exit(f"error: {err}")
