"""The results tables of docs/results.md and README.md, generated from the evidence records
(docs/evidence/METHOD/ARM/seed-N.json, written by scripts/evidence/record.py):

    python scripts/results_table.py            # print every method's tables
    python scripts/results_table.py --write    # rewrite the blocks between the markers
    python scripts/results_table.py --check    # exit 1 where a block differs from the records

A block is the text between `<!-- results-table:METHOD -->` and `<!-- /results-table:METHOD
-->`; it holds METHOD's tables: per arm and seed, the held-out accuracy at the start and at
the end, every other recorded evaluation's (e.g. teacher_free) and the final evaluation's
call share per family; the accuracy per family of every evaluation; where the records
hold issue 36's relay families, whether calls
concentrate where the student fails alone (its pre-registered Fisher criterion); where
their curves hold EAPO's consultation rate, whether it fades; then each
arm against the baseline arm (BASELINES for a method, else --baseline, default grpo) on
every evaluation both recorded but the start: each problem's correctness averaged over the
seeds, and a two-sided sign test over the problems (the problems are the independent draws).

--check prints one line per differing line and exits 1, or one OK line and exits 0; a block
naming a method without records, or a bad record, is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from collabrl.errors import UserError
from collabrl.eval.metrics import concentration, population_variance, sign_test
from collabrl.eval.report import format_p, format_value, to_markdown
from collabrl.train.evidence import HELD_OUT, Record, read_records
from collabrl.userfiles import read_user_text

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "docs" / "evidence"
FILES = (ROOT / "docs" / "results.md", ROOT / "README.md")
BASELINE = "grpo"  # GRPO without a collaborator, the same steps and data: every method's control
# Methods whose control is another arm: issue 48's relay diagnostics are read against D1
# (teacher tokens masked, group scenario), the arm that differs from issue 36 least;
# AlphaApollo's retrieval GRPO against GRPO with the tools banned.
BASELINES = {"relay-diag": "masked-group", "apollo-docs": "alone"}
# Methods whose evaluations cannot call a collaborator: EAPO's, with the channel locked as
# its paper evaluates, and rSIM's (a planner guides, it is never called). Their tables have
# no call shares and no concentration (they could only read 0).
NO_CALLS = frozenset({"eapo48", "rsim-band"})
# Methods with a pre-registered criterion on one evaluation against the control: the arm
# above it in at least SEEDS_ABOVE of SEEDS_NEEDED seeds and the sign test over problems,
# pooled across seeds, at p < 0.05 (EAPO's (a), on Pass@32), read beside Var (b) and the
# fade (c), which counts in as many seeds.
ABILITY = {"eapo48": "pass32"}
SEEDS_NEEDED, SEEDS_ABOVE = 3, 2
FADE = 0.5  # consultation fades: the last steps' rate at most half the first steps' (issue 36)
# Evaluations of one record set against each other, (evaluation, the one it is tested
# against) pairs per method. rSIM: the trained policy against its start; the trained
# planner driving the untouched reasoner against PS+ prompting and the untrained planner.
# AlphaApollo's retrieval: a policy with the tools against itself alone.
PAIRS = {
    "rsim-band": (("final", "start"), ("plug_in", "ps_plus"), ("plug_in", "untrained")),
    "apollo-docs": (("tools", "alone"),),
}
# Issue 36's relay families: those the warm-up student solves alone, and those it fails.
SOLVED, FAILED = ("add1",), ("add2", "mul22", "add3")
# A marker is a line of its own: one quoted in a sentence (as in results.md) is text.
OPEN = re.compile(r"^<!-- results-table:([\w-]+) -->$", re.M)
BLOCK = re.compile(
    r"^(<!-- results-table:([\w-]+) -->\n)(.*?)^(<!-- /results-table:\2 -->)$", re.S | re.M
)


# -- the tables ------------------------------------------------------------------------


def by_arm(records: list[Record], baseline: str) -> dict[str, list[Record]]:
    """The records by arm, each arm's by seed; the baseline arm last, the others by name."""
    arms: dict[str, list[Record]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r["seed"]):
        arms[record["arm"]].append(record)
    return {arm: arms[arm] for arm in sorted(arms, key=lambda a: (a == baseline, a))}


def seed_table(
    arms: dict[str, list[Record]], calls: bool = True
) -> tuple[list[str], list[list[str]]]:
    """Per arm and seed: each evaluation's accuracy and (with `calls`) the final one's
    call share per family; per arm of several seeds, their mean."""
    records = [r for seeds in arms.values() for r in seeds]
    extra = sorted({name for r in records for name in r["evals"]} - set(HELD_OUT))
    evals = [*HELD_OUT, *extra]
    shares = (r["evals"].get("final", {}).get("call_share", {}) for r in records)
    families = sorted({f for share in shares for f in share}) if calls else []
    header = ["arm", "seed", *evals, *(f"calls {f}" for f in families)]
    rows = []
    for arm, seeds in arms.items():
        cells = [_cells(r, evals, families) for r in seeds]
        rows += [
            [arm, str(r["seed"]), *map(format_value, c)] for r, c in zip(seeds, cells, strict=True)
        ]
        if len(seeds) > 1:
            rows.append(
                [arm, "mean", *(format_value(_mean(col)) for col in zip(*cells, strict=True))]
            )
    return header, rows


def _cells(record: Record, evals: list[str], families: list[str]) -> list[float | None]:
    """One record's accuracy per evaluation and final call share per family (None: not
    recorded)."""
    accuracies = [record["evals"].get(name, {}).get("accuracy") for name in evals]
    shares = record["evals"].get("final", {}).get("call_share", {})
    return accuracies + [shares.get(f) for f in families]


def _mean(values: tuple[float | None, ...]) -> float | None:
    """The mean of the seeds that recorded a value; None when none did."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def problem_means(seeds: list[Record], name: str) -> dict[str, float]:
    """Each problem's correctness on evaluation `name` averaged over the seeds, for the
    problems every seed scored (a mean over fewer seeds would weigh them unevenly)."""
    maps = [r["evals"][name]["correct"] for r in seeds]
    common = set.intersection(*(set(m) for m in maps))
    return {item: sum(m[item] for m in maps) / len(maps) for item in common}


def higher_lower(mine: dict[str, float], theirs: dict[str, float]) -> tuple[int, int]:
    """On the problems both score: how many `mine` is higher on, and how many lower."""
    items = mine.keys() & theirs.keys()
    return sum(mine[i] > theirs[i] for i in items), sum(mine[i] < theirs[i] for i in items)


def baseline_table(
    arms: dict[str, list[Record]], baseline: str
) -> tuple[list[str], list[list[str]]]:
    """Each arm against the baseline on the seeds both recorded (a seed the other arm has
    not run yet would tilt the comparison), on every evaluation both recorded in each."""
    header = ["arm", "seeds", "eval", "problems", "arm accuracy", f"{baseline} accuracy"]
    header += ["arm higher", f"{baseline} higher", "sign test p"]
    rows = []
    for arm, records in arms.items():
        both = {r["seed"] for r in records} & {r["seed"] for r in arms[baseline]}
        if arm == baseline or not both:
            continue
        seeds = [r for r in records if r["seed"] in both]
        control = [r for r in arms[baseline] if r["seed"] in both]
        shared = set.intersection(*(set(r["evals"]) for r in seeds + control))
        for name in sorted(shared - {"start"}):
            mine, theirs = problem_means(seeds, name), problem_means(control, name)
            items = mine.keys() & theirs.keys()
            gained, lost = higher_lower(mine, theirs)
            means = [
                sum(side[i] for i in items) / len(items) if items else None
                for side in (mine, theirs)
            ]
            rows.append(
                [arm, ", ".join(map(str, sorted(both))), name, str(len(items))]
                + list(map(format_value, means))
                + [str(gained), str(lost), format_p(sign_test(gained, lost))]
            )
    return header, rows


def paired_table(
    arms: dict[str, list[Record]], pairs: tuple[tuple[str, str], ...]
) -> tuple[list[str], list[list[str]]]:
    """Per arm and (A, B) pair of evaluations its records hold: the accuracies, then the
    problems where A is higher and where B is, with a two-sided sign test, twice: summed
    over seeds (each seed's problem a draw, as rSIM's criteria were pre-registered) and
    counted once a problem (its correctness averaged over the seeds: the seeds share the
    problems, so this is the stricter reading)."""
    header = ["arm", "seeds", "eval", "against", "problems", "eval accuracy", "against accuracy"]
    header += ["higher / lower, summed over seeds", "p", "higher / lower, once a problem", "p"]
    rows = []
    for arm, records in arms.items():
        for first, second in pairs:
            seeds = [r for r in records if first in r["evals"] and second in r["evals"]]
            if not seeds:
                continue
            per_seed = [
                higher_lower(r["evals"][first]["correct"], r["evals"][second]["correct"])
                for r in seeds
            ]
            summed = [sum(side) for side in zip(*per_seed, strict=True)]
            mine, theirs = problem_means(seeds, first), problem_means(seeds, second)
            items = mine.keys() & theirs.keys()
            once = higher_lower(mine, theirs)
            means = [
                _mean(tuple(r["evals"][name]["accuracy"] for r in seeds))
                for name in (first, second)
            ]
            rows.append(
                [arm, ", ".join(str(r["seed"]) for r in seeds), first, second, str(len(items))]
                + list(map(format_value, means))
                + [f"{summed[0]} / {summed[1]}", format_p(sign_test(*summed))]
                + [f"{once[0]} / {once[1]}", format_p(sign_test(*once))]
            )
    return header, rows


def family_table(arms: dict[str, list[Record]]) -> tuple[list[str], list[list[str]]]:
    """Per arm, seed and evaluation: the accuracy on each family (where recorded), so
    that "where does it gain" reads off the records as "where does it call" does."""
    records = [r for seeds in arms.values() for r in seeds]
    families = sorted(
        {f for r in records for e in r["evals"].values() for f in e.get("family_accuracy", {})}
    )
    rows = []
    for arm, seeds in arms.items():
        for record in seeds:
            for name, summary in record["evals"].items():
                shares = summary.get("family_accuracy", {})
                if shares:
                    cells = [format_value(shares.get(f)) for f in families]
                    rows.append([arm, str(record["seed"]), name, *cells])
    return ["arm", "seed", "eval", *families], rows


def pooled_calls(record: Record, families: tuple[str, ...]) -> tuple[int, int] | None:
    """(calling, episodes) of the final evaluation over `families`, or None when the
    record has none of them."""
    final = record["evals"].get("final", {})
    sizes, shares = final.get("family_episodes", {}), final.get("call_share", {})
    known = [f for f in families if f in sizes and f in shares]
    if not known:
        return None
    return sum(round(shares[f] * sizes[f]) for f in known), sum(sizes[f] for f in known)


def concentration_table(arms: dict[str, list[Record]]) -> tuple[list[str], list[list[str]]]:
    """Issue 36's criterion per arm and seed, on the final (with-teacher) evaluation: the
    share of episodes that call on the families the student solves alone against those it
    fails, the one-sided Fisher p, and whether the calls concentrate. Empty when no record
    has both kinds of family."""
    header = ["arm", "seed", "calls on " + "+".join(SOLVED), "calls on " + "+".join(FAILED)]
    header += ["Fisher p", "concentrates"]
    rows = []
    for arm, seeds in arms.items():
        for record in seeds:
            solved, failed = pooled_calls(record, SOLVED), pooled_calls(record, FAILED)
            if solved is None or failed is None:
                continue
            p, shown = concentration(solved, failed)
            shares = [format_value(c / n) for c, n in (solved, failed)]
            rows.append([arm, str(record["seed"]), *shares, format_p(p), "yes" if shown else "no"])
    return header, rows


def after_refusal(record: Record) -> tuple[int, int, int] | None:
    """Issue 48's refusal probe on one greedy record: of the problems whose episode
    consulted with every answer refused, how many it still answered right, and how many of
    the same problems it answers right with the channel locked; (right, consulted, locked).
    None when the record has no `refused` and `locked` evaluations."""
    refused, locked = record["evals"].get("refused"), record["evals"].get("locked")
    if refused is None or locked is None or "called" not in refused:
        return None
    consulted = [item for item, share in refused["called"].items() if share > 0]
    right = sum(round(refused["correct"][item]) for item in consulted)
    alone = sum(round(locked["correct"].get(item, 0)) for item in consulted)
    return right, len(consulted), alone


def refusal_table(arms: dict[str, list[Record]]) -> tuple[list[str], list[list[str]]]:
    """The probe's criterion per warm-up: accuracy with every answer let in, refused and
    locked; after a refusal, the share answered right against the locked accuracy on the
    same problems, and whether it is at least half of it (n/a where the locked policy
    solves none of them: the criterion then says nothing). Empty for other records."""
    header = ["warm-up", "accepted", "refused", "locked", "consulted (refused)"]
    header += ["right after a refusal", "locked, same problems", "at least half"]
    rows = []
    for arm, seeds in arms.items():
        for record in seeds:
            probe = after_refusal(record)
            if probe is None:
                continue
            right, consulted, alone = probe
            evals = record["evals"]
            accuracies = [
                format_value(evals.get(k, {}).get("accuracy"))
                for k in ("accepted", "refused", "locked")
            ]
            verdict = "n/a (locked 0)" if alone == 0 else "yes" if 2 * right >= alone else "no"
            rows.append(
                [
                    arm,
                    *accuracies,
                    f"{consulted} of {evals['refused']['problems']}",
                    f"{right} of {consulted}",
                    f"{alone} of {consulted}",
                    verdict,
                ]
            )
    return header, rows


def consult_rates(record: Record) -> tuple[float, float, float | None] | None:
    """The consultation rate of the record's first curve window and of its last (EAPO's
    criterion: steps 13-16 against 1-4 of a 16-step run); None without two windows that
    log it. The last counts the calls its turn budget left unsent too: at a budget of 1 a
    written call sends nothing, so its sent rate alone would show a fade the budget forced.
    (At a budget of 2 an episode that sent and then wrote again counts twice: the last
    rate is an upper bound, which makes a fade harder to show, never easier.) Third, the
    last window's mean turn budget (None: not recorded)."""
    points = [p for p in record["curve"] if "consult_rate" in p]
    if len(points) < 2:
        return None
    last = points[-1]
    sent_or_cut = last["consult_rate"] + last.get("budget_cut", 0.0)
    return points[0]["consult_rate"], sent_or_cut, last.get("turn_budget")


def fade_ratio(record: Record) -> float | None:
    """The last window's consultation rate (sent + cut) over the first's; None where the
    record logs no rate or never consulted at first."""
    rates = consult_rates(record)
    if rates is None or not rates[0]:
        return None
    return rates[1] / rates[0]


def fade_table(arms: dict[str, list[Record]]) -> tuple[list[str], list[list[str]]]:
    """Per arm and seed: the consultation rate in the first and the last window of steps
    (with the calls the turn budget cut), the last window's turn budget, their ratio, and
    whether consultation fades (the last at most half the first, as issue 36
    pre-registered). Empty for records whose curves hold no rate."""
    header = ["arm", "seed", "consult rate, first steps", "last steps (sent + cut)"]
    header += ["turn budget, last steps", "last ÷ first", "fades (≤ 0.5)"]
    rows = []
    for arm, seeds in arms.items():
        for record in seeds:
            rates = consult_rates(record)
            if rates is None:
                continue
            first, last, budget = rates
            ratio = fade_ratio(record)
            # A window's mean budget: 2, or 1.5 where it shrank inside the window.
            shown = "-" if budget is None else f"{budget:g}"
            cells = [format_value(first), format_value(last), shown]
            fades = "n/a (never consulted)" if ratio is None else "yes" if ratio <= FADE else "no"
            rows.append([arm, str(record["seed"]), *cells, format_value(ratio), fades])
    return header, rows


def criteria_table(
    arms: dict[str, list[Record]], baseline: str, name: str
) -> tuple[list[str], list[list[str]]]:
    """Per arm, the pre-registered criteria on evaluation `name` against the baseline, on
    the seeds both ran: (a) the seeds where the arm is above, the pooled sign test and
    the verdict (open until SEEDS_NEEDED seeds); (b) Var, the population variance of the
    per-problem scores, each seed's then their mean, descriptive; (c) the seeds whose
    consultation fades and the verdict."""
    header = ["arm", "seeds", f"{name} above {baseline}", "pooled sign test p", "(a)"]
    header += ["Var", f"Var {baseline}", "consultation fades", "(c)"]
    control = {r["seed"]: r for r in arms.get(baseline, [])}
    rows = []
    for arm, records in arms.items():
        seeds = [r for r in records if r["seed"] in control and name in r["evals"]]
        seeds = [r for r in seeds if name in control[r["seed"]]["evals"]]
        if arm == baseline or not seeds:
            continue
        theirs = [control[r["seed"]] for r in seeds]
        above = sum(
            r["evals"][name]["accuracy"] > c["evals"][name]["accuracy"]
            for r, c in zip(seeds, theirs, strict=True)
        )
        p = sign_test(*higher_lower(problem_means(seeds, name), problem_means(theirs, name)))
        ratios = [fade_ratio(r) for r in seeds]
        faded = sum(ratio is not None and ratio <= FADE for ratio in ratios)
        rows.append(
            [arm, ", ".join(str(r["seed"]) for r in seeds), f"{above} of {len(seeds)}"]
            + [format_p(p), _verdict(len(seeds), above, p < 0.05)]
            + [format_value(_variance(seeds, name)), format_value(_variance(theirs, name))]
            + [f"{faded} of {len(seeds)}", _verdict(len(seeds), faded)]
        )
    return header, rows


def _variance(records: list[Record], name: str) -> float | None:
    """EAPO's Var on evaluation `name`, the mean over the records' seeds."""
    return _mean(
        tuple(population_variance(list(r["evals"][name]["correct"].values())) for r in records)
    )


def _verdict(seeds: int, counted: int, test: bool = True) -> str:
    """A criterion met in `counted` of `seeds` seeds (and, where it has one, its pooled
    `test`): open until SEEDS_NEEDED seeds, unless the seeds left cannot bring the count
    to SEEDS_ABOVE."""
    if counted + max(SEEDS_NEEDED - seeds, 0) < SEEDS_ABOVE:
        return f"not shown ({counted} of {seeds}: cannot reach {SEEDS_ABOVE} of {SEEDS_NEEDED})"
    if seeds < SEEDS_NEEDED:
        return f"open ({seeds} of {SEEDS_NEEDED} seeds)"
    return "shown" if counted >= SEEDS_ABOVE and test else "not shown"


def render(method: str, records: list[Record], baseline: str) -> str:
    """METHOD's block: a note that it is generated, then its tables."""
    arms, calls = by_arm(records, baseline), method not in NO_CALLS
    parts = [
        f"_Generated by `python scripts/results_table.py --write` from the {len(records)} "
        f"records in docs/evidence/{method}/: change the records, not this table._",
        to_markdown(*seed_table(arms, calls)),
    ]
    tables = [family_table(arms), refusal_table(arms), fade_table(arms)]
    if calls:
        tables.insert(1, concentration_table(arms))
    if baseline in arms:
        tables.append(baseline_table(arms, baseline))
    if method in ABILITY and baseline in arms:
        tables.append(criteria_table(arms, baseline, ABILITY[method]))
    if method in PAIRS:
        tables.append(paired_table(arms, PAIRS[method]))
    parts += [to_markdown(header, rows) for header, rows in tables if rows]
    return "\n\n".join(parts) + "\n"


def tables(evidence: Path, baseline: str) -> dict[str, str]:
    """Every method's block text, from the records under `evidence`, each against its own
    control arm (BASELINES) or `baseline`."""
    methods: dict[str, list[Record]] = defaultdict(list)
    for record in read_records(evidence):
        methods[record["method"]].append(record)
    return {
        method: render(method, records, BASELINES.get(method, baseline))
        for method, records in methods.items()
    }


# -- the blocks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A block of a file: its method, its first line's number and its text."""

    method: str
    line: int
    text: str


def blocks(path: Path, text: str) -> list[Block]:
    """The results-table blocks of a file, refused if a marker is left unclosed."""
    found = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start(3)) + 1
        found.append(Block(match.group(2), line, match.group(3)))
    if len(found) != len(OPEN.findall(text)):
        raise UserError(
            f"{path} has a results-table marker without its <!-- /results-table:NAME -->",
            "close every block on a line of its own",
        )
    return found


def expected(path: Path, block: Block, generated: dict[str, str]) -> str:
    if block.method not in generated:
        raise UserError(
            f"{path}:{block.line}: block results-table:{block.method} has no records "
            f"(docs/evidence/{block.method}/)",
            "record the method's runs with scripts/evidence/record.py, or remove the block",
        )
    return generated[block.method]


def differences(path: Path, block: Block, want: str) -> list[str]:
    """One line per line of `block` that is not what the records give."""
    have_lines, want_lines = block.text.splitlines(), want.splitlines()
    lines = []
    matcher = difflib.SequenceMatcher(a=have_lines, b=want_lines, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            continue
        pairs = itertools.zip_longest(have_lines[a0:a1], want_lines[b0:b1])
        for offset, (have, need) in enumerate(pairs):
            lines.append(
                f"{path}:{block.line + a0 + offset}: results-table:{block.method} has "
                f"{_shown(have)}, the records give {_shown(need)}"
            )
    return lines


def _shown(line: str | None) -> str:
    return "no line" if line is None else repr(line)


def check(files: list[Path], generated: dict[str, str]) -> int:
    """Print each difference and return 1, or an OK line and 0."""
    problems, checked = [], 0
    for path in files:
        for block in blocks(path, read_user_text(path, "document")):
            checked += 1
            problems += differences(path, block, expected(path, block, generated))
    if problems:
        print("\n".join(problems))
        print(f"{len(problems)} differing line(s): run python scripts/results_table.py --write")
        return 1
    print(f"OK: {checked} results-table blocks checked, all as the records give")
    return 0


def write(files: list[Path], generated: dict[str, str]) -> None:
    """Rewrite every block from the records (files without a block stay untouched)."""
    for path in files:
        text = read_user_text(path, "document")
        for block in blocks(path, text):
            expected(path, block, generated)  # refused before any file is written
        new = BLOCK.sub(lambda m: m.group(1) + generated[m.group(2)] + m.group(4), text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {path}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="results_table.py", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the blocks")
    mode.add_argument("--check", action="store_true", help="exit 1 where a block differs")
    parser.add_argument("--evidence", type=Path, default=EVIDENCE, help="the records' folder")
    parser.add_argument("--files", type=Path, nargs="+", default=list(FILES))
    parser.add_argument("--baseline", default=BASELINE, help="the arm every arm is tested against")
    args = parser.parse_args(argv)
    generated = tables(args.evidence, args.baseline)
    if args.check:
        return check(args.files, generated)
    if args.write:
        write(args.files, generated)
        return 0
    for method, text in generated.items():
        print(f"<!-- results-table:{method} -->\n{text}<!-- /results-table:{method} -->\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as err:  # bad input: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
