"""RelayLLM with a teacher that writes the next n tokens, across seeds (docs/results.md),
from the run folders `scripts/reproduce.sh relay` writes under OUT:

    python scripts/evidence/relay_seeds.py OUT SEED...

(`RELAY_ARMS="difficulty_aware grpo"`, as for reproduce.sh, tables only those arms)

prints four markdown tables, in three parts:

1. Where the calls go: per relay arm (difficulty_aware, simple) and seed, each family's
   held-out accuracy with the teacher (`ARM-seedS/eval-final`) and the share of its
   episodes that call, and the pre-registered criterion "calls concentrate on the
   families the student fails alone": the call share on add1 (solved alone ~85 %) is at
   most half the call share on add2, mul22 and add3 pooled, AND a one-sided Fisher exact
   test of the 2x2 table (add1 or not, called or not) gives p < 0.05. Then, per arm, the
   calls summed over seeds, the share of seeds that show it, and a pooled test: Fisher's
   method over the seeds' one-sided p-values (-2 Σ ln p against χ² with 2k degrees of
   freedom; conservative, since each p is discrete).
2. Table 4, teacher-free: the accuracy with the call tags banned (`eval-teacher-free`) of
   the warm-up and of every arm and seed, per family and overall; then each relay arm
   against GRPO without a teacher: each problem's correctness averaged over the seeds, a
   two-sided sign test over the problems (the problems are the independent draws, as in
   eapo_seeds.py), and the share of seeds where the relay arm is at least GRPO's.
3. Why, from each relay run's rollouts.jsonl (pooled over seeds), per family and window of
   4 steps: the share of episodes that call, how many callers and non-callers were right,
   the tokens the teacher wrote in a calling episode, the mean of each reward part, and
   the prompt groups (one problem at one step of one seed) with at least 2 logged samples:
   the share where all fail / some do / all succeed, and among the mixed ones with callers
   and non-callers, how many had the callers right more often, and how many less often.
   Only the episodes rollouts.jsonl kept count (`save_rollouts`, the first N of each
   step): "samples/group" says how complete the groups are, and a note on stderr names
   each run that kept less than its whole batch.
"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from scipy.stats import combine_pvalues

from collabrl import runs
from collabrl.config import read_yaml
from collabrl.episode import Author, Episode
from collabrl.errors import UserError
from collabrl.eval.metrics import concentration, sign_test
from collabrl.eval.report import format_p, format_value, load_run, samples_by_item, to_markdown
from collabrl.train.evidence import accuracy, calling
from collabrl.train.run import ROLLOUTS

# The arms reproduce.sh ran: its RELAY_ARMS, so that a partial run is tabled as it is.
ARMS = os.environ.get("RELAY_ARMS", "difficulty_aware simple grpo").split()
RELAY_ARMS = tuple(arm for arm in ("difficulty_aware", "simple") if arm in ARMS)
BASELINE = "grpo"  # GRPO without a teacher, the same steps and data
WITH_TEACHER = "eval-final"  # each run's held-out evaluation, relay protocol with the teacher
ALONE = "eval-teacher-free"  # the same held-out set, the call tags banned (Table 4)
WARMUP_ALONE = "eval-warmup-teacher-free"
FAMILY = re.compile(r"arith(?:_steps)?-\w+-(\w+)-")  # reproduce.sh's FAMILY
SOLVED = ("add1",)  # the families the student solves alone (~85 %) ...
FAILED = ("add2", "mul22", "add3")  # ... and those it fails
ALPHA = 0.05
WINDOW = 4  # steps per row of the rollout table: a step is only 4 prompts
OTHER = "(other)"  # a problem whose id names no family

Samples = list[dict[str, Any]]


def family(item: str) -> str:
    match = FAMILY.search(item)
    return match.group(1) if match else OTHER


def ordered(families: set[str]) -> list[str]:
    """The pre-registered families first, in their order, then any other."""
    known = [f for f in (*SOLVED, *FAILED) if f in families]
    return known + sorted(families - set(known))


def samples_by_family(run_dir: Path) -> dict[str, Samples]:
    """A `collab eval` folder's samples by the family in their problem's id."""
    out: dict[str, Samples] = defaultdict(list)
    for item, samples in samples_by_item(load_run(run_dir)).items():
        out[family(item)] += samples
    return out


def opened(samples: Samples) -> int:
    """Episodes that wrote `<call>`, answered or not: a call left unclosed (its n padded
    with digits to the budget) is no call to `calling` but shows here."""
    return sum("<call>" in s.get("completion", "") for s in samples)


def share(count: int, total: int) -> str:
    return format_value(count / total) if total else "-"


# -- 1. where the calls go ------------------------------------------------------------


def pooled_calls(families: dict[str, Samples], group: tuple[str, ...], run_dir: Path) -> list[int]:
    """[episodes that call, episodes] over the families of `group`, pooled."""
    samples = [s for f in group for s in families.get(f, [])]
    if not samples:
        raise UserError(f"{run_dir} has no problem of {', '.join(group)}", "is it the relay set?")
    return [calling(samples), len(samples)]


def opened_share(families: dict[str, Samples], group: tuple[str, ...]) -> str:
    samples = [s for f in group for s in families.get(f, [])]
    return share(opened(samples), len(samples))


def call_table(out: Path, seeds: list[str]) -> tuple[list[str], list[list[str]]]:
    """Per relay arm and seed: each family's accuracy with the teacher (and its call
    share), the call shares the criterion compares, its p and verdict; per arm the calls
    summed over seeds, the share of seeds that show it and Fisher's combined p."""
    loaded = {
        (arm, seed): samples_by_family(out / f"{arm}-seed{seed}" / WITH_TEACHER)
        for arm in RELAY_ARMS
        for seed in seeds
    }
    names = ordered({f for families in loaded.values() for f in families})
    header = ["arm", "seed", *(f"{f} acc (calls)" for f in names)]
    header += [f"calls {'+'.join(SOLVED)}", f"calls {'+'.join(FAILED)}", "Fisher p", "concentrates"]
    header += [f"opened {'+'.join(SOLVED)}", f"opened {'+'.join(FAILED)}"]
    rows = []
    for arm in RELAY_ARMS:
        total, ps, shown = [0, 0, 0, 0], [], 0
        for seed in seeds:
            families = loaded[arm, seed]
            run_dir = out / f"{arm}-seed{seed}" / WITH_TEACHER
            split = [
                n for group in (SOLVED, FAILED) for n in pooled_calls(families, group, run_dir)
            ]
            p, concentrates = concentration((split[0], split[1]), (split[2], split[3]), ALPHA)
            total, shown = [a + b for a, b in zip(total, split, strict=True)], shown + concentrates
            ps.append(p)
            cells = [_family_cell(families.get(f, [])) for f in names]
            attempts = [opened_share(families, group) for group in (SOLVED, FAILED)]
            rows.append(
                [arm, seed, *cells, share(*split[:2]), share(*split[2:]), format_p(p)]
                + [str(concentrates).lower(), *attempts]
            )
        pooled = float(combine_pvalues(ps, method="fisher").pvalue)
        blanks = [""] * len(names)
        rows.append(
            [arm, "pooled", *blanks, share(*total[:2]), share(*total[2:]), format_p(pooled)]
            + [f"{shown}/{len(seeds)} seeds", "", ""]
        )
    return header, rows


def _family_cell(samples: Samples) -> str:
    if not samples:
        return "-"
    return f"{format_value(accuracy(samples))} ({share(calling(samples), len(samples))})"


# -- 2. Table 4: teacher-free ---------------------------------------------------------


def alone_runs(out: Path, seeds: list[str]) -> dict[str, Path]:
    """Every teacher-free evaluation by its row's name: the warm-up, then arm x seed."""
    found = {"warm-up": out / WARMUP_ALONE}
    arms = (*RELAY_ARMS, BASELINE) if BASELINE in ARMS else RELAY_ARMS
    for arm in arms:
        found |= {f"{arm}-seed{seed}": out / f"{arm}-seed{seed}" / ALONE for seed in seeds}
    return found


def alone_table(out: Path, seeds: list[str]) -> tuple[list[str], list[list[str]]]:
    """Table 4: each policy's accuracy without a teacher, per family and overall."""
    loaded = {name: samples_by_family(path) for name, path in alone_runs(out, seeds).items()}
    names = ordered({f for families in loaded.values() for f in families})
    rows = []
    for name, families in loaded.items():
        cells = [format_value(accuracy(families[f])) if f in families else "-" for f in names]
        every = [s for samples in families.values() for s in samples]
        rows.append([name, *cells, format_value(accuracy(every))])
    return ["policy", *names, "overall"], rows


def problem_accuracy(run_dir: Path) -> dict[str, float]:
    """Each problem's share of right samples (its correctness, at one sample)."""
    return {item: accuracy(s) for item, s in samples_by_item(load_run(run_dir)).items()}


def against_grpo(out: Path, seeds: list[str]) -> tuple[list[str], list[list[str]]]:
    """Each relay arm against GRPO, teacher-free: the sign test over problems of their
    correctness averaged over seeds, and the share of seeds where the arm is >= GRPO."""
    grpo = [problem_accuracy(out / f"{BASELINE}-seed{seed}" / ALONE) for seed in seeds]
    header = ["arm", "problems", "arm accuracy", "GRPO accuracy", "arm higher", "GRPO higher"]
    header += ["sign test p", "seeds arm >= GRPO"]
    rows = []
    for arm in RELAY_ARMS:
        relay = [problem_accuracy(out / f"{arm}-seed{seed}" / ALONE) for seed in seeds]
        # Only problems every run scored: a mean over fewer seeds would weigh them unevenly.
        items = set.intersection(*(set(run) for run in relay + grpo))
        mine = {i: sum(run[i] for run in relay) / len(seeds) for i in items}
        theirs = {i: sum(run[i] for run in grpo) / len(seeds) for i in items}
        gained = sum(mine[i] > theirs[i] for i in items)
        lost = sum(mine[i] < theirs[i] for i in items)
        # Per seed, the same held-out set: arm and GRPO on their common problems.
        at_least = sum(_mean(r, items) >= _mean(g, items) for r, g in zip(relay, grpo, strict=True))
        rows.append(
            [
                arm,
                str(len(items)),
                format_value(_mean(mine, items)),
                format_value(_mean(theirs, items)),
            ]
            + [str(gained), str(lost), format_p(sign_test(gained, lost))]
            + [f"{at_least}/{len(seeds)}"]
        )
    return header, rows


def _mean(values: dict[str, float], items: set[str]) -> float:
    return sum(values[i] for i in items) / len(items) if items else 0.0


# -- 3. why: the training rollouts ------------------------------------------------------

# What the rollout table reads of a rollouts.jsonl record (collabrl.train.rollout.RolloutLog).
ROLLOUT_FIELDS = ("step", "correct", "calls", "rewards", "episode")


def read_rollouts(run: Path) -> list[dict[str, Any]]:
    """A training run's rollouts.jsonl, refused in one line if missing or not scored."""
    path = run / ROLLOUTS
    if not path.is_file():
        raise UserError(f"{path} is missing", "has the relay run trained (save_rollouts > 0)?")
    records = runs.read_records(path)
    note = incomplete_groups(run)
    if note:
        print(f"note: {note}", file=sys.stderr)
    for number, record in enumerate(records, 1):
        missing = [key for key in ROLLOUT_FIELDS if record.get(key) is None]
        if missing:
            raise UserError(f"{path}: record {number} has no {missing[0]}", "re-run the training")
    return records


def incomplete_groups(run: Path) -> str | None:
    """What a run's config says of its rollouts.jsonl, when it kept only the first episodes
    of each step's batch (`save_rollouts`, 4 by default): then its groups are cut short."""
    path = run / runs.CONFIG
    if not path.is_file():
        return None
    config = read_yaml(path)
    batch = config.get("prompts_per_step", 0) * config.get("sampling", {}).get("n", 0)
    kept = config.get("save_rollouts", batch)
    if kept >= batch:
        return None
    return (
        f"{run} kept {kept} of the {batch} episodes of each step (save_rollouts): its groups "
        f"and call shares are partial; train with --set save_rollouts={batch}"
    )


def rollout_table(out: Path, seeds: list[str]) -> tuple[list[str], list[list[str]]]:
    """Per relay arm, family and window of steps, pooled over the seeds: the call share,
    the reward parts and the composition of the prompt groups."""
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    parts: set[str] = set()
    for arm in RELAY_ARMS:
        for seed in seeds:
            for record in read_rollouts(out / f"{arm}-seed{seed}"):
                problem = record["episode"]["problem_id"]
                start = (record["step"] - 1) // WINDOW * WINDOW + 1
                cells[arm, family(problem), start].append({**record, "seed": seed})
                parts |= set(record["rewards"])
    names = sorted(parts)
    header = ["arm", "family", "steps", "episodes", "call share"]
    header += ["callers' accuracy", "non-callers' accuracy", "teacher tokens a caller"]
    header += [f"reward {p}" for p in names]
    header += ["groups", "samples/group", "all fail", "mixed", "all succeed"]
    header += ["callers right", "non-callers right"]
    order = {f: i for i, f in enumerate(ordered({f for _, f, _ in cells}))}
    rows = []
    for arm, fam, start in sorted(cells, key=lambda k: (RELAY_ARMS.index(k[0]), order[k[1]], k[2])):
        records = cells[arm, fam, start]
        means = [_mean_part(records, p) for p in names]
        span = f"{start}-{start + WINDOW - 1}"
        rows.append(
            [arm, fam, span, str(len(records)), share(calling(records), len(records))]
            + caller_cells(records)
            + means
            + group_cells(records)
        )
    return header, rows


def caller_cells(records: list[dict[str, Any]]) -> list[str]:
    """Right answers among the episodes that called and among those that did not (right/of),
    and the tokens the teacher wrote in a calling episode: what a call brought then."""
    called, alone = split_by_calling(records)
    written = [Episode.from_dict(r["episode"]).tokens_by(Author.TEACHER) for r in called]
    return [
        _right(called),
        _right(alone),
        format_value(sum(written) / len(written)) if written else "-",
    ]


def _right(records: list[dict[str, Any]]) -> str:
    return f"{sum(bool(r['correct']) for r in records)}/{len(records)}"


def split_by_calling(
    records: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The episodes that called the teacher, and those that did not."""
    return [r for r in records if r["calls"] > 0], [r for r in records if r["calls"] == 0]


def _mean_part(records: list[dict[str, Any]], part: str) -> str:
    """A reward part's mean over the episodes it applied to (None: it did not)."""
    values = [r["rewards"][part] for r in records if r["rewards"].get(part) is not None]
    return format_value(sum(values) / len(values)) if values else "-"


def group_cells(records: list[dict[str, Any]]) -> list[str]:
    """The prompt groups (seed, step, problem) of at least 2 logged samples: how many, their
    mean size, the share where all fail / mixed / all succeed, and among the mixed ones with
    both callers and non-callers, how many had the callers right more often and how many
    less often, of them (GRPO learns to call, or not to, from those)."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[r["seed"], r["step"], r["episode"]["problem_id"]].append(r)
    sampled = [g for g in groups.values() if len(g) > 1]
    right = [sum(bool(r["correct"]) for r in g) for g in sampled]
    fail = sum(k == 0 for k in right)
    succeed = sum(k == len(g) for k, g in zip(right, sampled, strict=True))
    mixed = [g for k, g in zip(right, sampled, strict=True) if 0 < k < len(g)]
    callers = no_callers = contrasted = 0
    for g in mixed:
        called, alone = split_by_calling(g)
        if called and alone:
            contrasted += 1
            callers += accuracy(called) > accuracy(alone)
            no_callers += accuracy(called) < accuracy(alone)
    size = sum(map(len, sampled)) / len(sampled) if sampled else 0.0
    count = len(sampled)
    return [str(count), format_value(size), share(fail, count), share(len(mixed), count)] + [
        share(succeed, count),
        f"{callers}/{contrasted}",
        f"{no_callers}/{contrasted}",
    ]


def main(out: Path, seeds: list[str]) -> None:
    tables = [
        ("Calls per family with the teacher, and the pre-registered criterion", call_table),
        ("Table 4: teacher-free accuracy", alone_table),
        ("Teacher-free, relay arms against GRPO over seeds", against_grpo),
        ("Why: training rollouts per family and window of steps", rollout_table),
    ]
    if BASELINE not in ARMS:  # RELAY_ARMS without grpo: nothing to compare against
        tables.pop(2)
    for title, table in tables:
        header, rows = table(out, seeds)
        print(f"\n**{title}**\n\n{to_markdown(header, rows)}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    try:
        main(Path(sys.argv[1]), sys.argv[2:])
    except UserError as err:  # a run not finished yet: one line, no traceback
        sys.exit(f"error: {err}")
