"""Does R_acc carry signal? The share of rSIM training groups whose episodes disagree.

A group is one problem's `num_generations` episodes of one step. When all are right or
all wrong, R_acc is the same for each and its group-centred advantage is 0: the planner
then learns from the shaping terms alone (docs/results.md, the first rsim runs). This
reads each run's rollouts.jsonl, which must keep every episode of a step
(`--set save_rollouts=N` with N = prompts per step × num_generations), and prints a
markdown table: per run, the groups, the share of them with both right and wrong
episodes ("mixed"), and the episodes' accuracy, over the first and the second half of
the steps.

    python scripts/evidence/rsim_groups.py runs/evidence/rsim-band/joint-seed0 ...
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from collabrl.runs import read_records


def groups(run: Path) -> dict[tuple[int, str], list[bool]]:
    """Every (step, problem) group's correctness, from the run's kept episodes."""
    found: dict[tuple[int, str], list[bool]] = defaultdict(list)
    for record in read_records(run / "rollouts.jsonl"):
        found[record["step"], record["episode"]["problem_id"]].append(bool(record["correct"]))
    return found


def row(name: str, found: dict[tuple[int, str], list[bool]]) -> str:
    mixed = sum(len(set(c)) > 1 for c in found.values())
    episodes = [c for group in found.values() for c in group]
    accuracy = sum(episodes) / len(episodes) if episodes else 0.0
    share = mixed / len(found) if found else 0.0
    return f"| {name} | {len(found)} | {mixed} ({share:.2f}) | {accuracy:.3f} |"


def main(argv: list[str]) -> None:
    print("| run · steps | groups | mixed (share) | episode accuracy |")
    print("| --- | --- | --- | --- |")
    for run in map(Path, argv):
        found = groups(run)
        sizes = {len(c) for c in found.values()}
        if len(sizes) > 1:
            # Fewer episodes kept than a step has: a group may be cut, its variance unknown.
            sys.exit(f"error: {run}: groups of sizes {sorted(sizes)}; raise save_rollouts")
        steps = sorted({step for step, _ in found})
        half = steps[len(steps) // 2] if steps else 0
        first = {key: c for key, c in found.items() if key[0] < half}
        second = {key: c for key, c in found.items() if key[0] >= half}
        print(row(f"{run.name} · all", found))
        print(row(f"{run.name} · steps < {half}", first))
        print(row(f"{run.name} · steps ≥ {half}", second))


if __name__ == "__main__":
    main(sys.argv[1:])
