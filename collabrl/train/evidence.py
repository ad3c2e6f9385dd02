"""Evidence records: the numbers of one finished training run, small enough to commit, so
that a fresh checkout can re-check the tables of docs/results.md and a long reproduction
can be split across sessions (a unit whose record exists is not run again).

A record is `docs/evidence/<method>/<arm>/seed-<n>.json`, one run (unit) each, written by
`scripts/evidence/record.py` from the run folder and read by `scripts/results_table.py`:

    schema       RECORD_SCHEMA, bumped when a field changes meaning
    method, arm, seed
    commit       the git commit the run trained at (its config.yaml header), or null
    config_hash  `config_hash` of the run's config: a unit is the same experiment while it holds
    wall_time_s  the unit's seconds as reproduce.sh measured them (record.py --seconds),
                 else TRL's train_runtime: the training loop alone (the last session's on a
                 resumed run), or null
    evals        by name ("start", "final", and extra ones such as "teacher_free"): n (samples
                 a problem), problems, accuracy (mean over problems), correct (each problem's
                 share of right samples: 0 or 1 at greedy n = 1), called (each problem's share
                 of episodes that called at least once), call_share (per family, the
                 share of episodes that called at least once), family_episodes (per family,
                 the episodes that share is of), family_accuracy (per family, the share of
                 right episodes)
    curve        per window of CURVE_WINDOW steps: the steps ("1-4") and the mean of each of
                 CURVE_KEYS the run logged there
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.config import build_config, read_yaml, to_dict
from collabrl.errors import UserError
from collabrl.eval.report import load_run, samples_by_item
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.methods import registry as methods
from collabrl.train.resolve import unread_keys
from collabrl.train.run import EVALUATION, METRICS, STEP_LINE_KEYS
from collabrl.userfiles import read_json

RECORD_SCHEMA = 1
# reproduce.sh's family of a problem, from its id (arith-test-add1-0003 is add1).
FAMILY = r"arith(?:_steps)?-\w+-(\w+)-"
OTHER = "(other)"  # the family of a problem whose id names none
# The held-out evaluations every run with --eval-data makes, by their record name.
HELD_OUT = {"start": "eval-start", "final": "eval-final"}
# Left out of the hash: where the run was written and whether it resumed say nothing of the
# experiment, and the seed is the unit's own (its record's path names it).
UNHASHED = ("out", "seed", "resume")
CURVE_WINDOW = 4  # steps per curve point: a step is only a few prompts
# What a step's log line shows (reward, accuracy, calls, call ratio), as record keys.
CURVE_KEYS = {name.replace(" ", "_"): key for name, key in STEP_LINE_KEYS.items()} | {
    # EAPO: the share of episodes that sent a query, the turn budget, and the share whose
    # call that budget left unsent (a budget of 1 sends none: a fade it forces, not learnt).
    "consult_rate": "episodes/consult_rate",
    "turn_budget": "turn_budget",
    "budget_cut": "episodes/end/turn_budget",
}
DIGITS = 6  # rounding of stored shares and means: exact for counts under 10^6

Samples = list[dict[str, Any]]
Record = dict[str, Any]


def accuracy(samples: Samples) -> float:
    """The share of `samples` that were right."""
    return sum(bool(s["correct"]) for s in samples) / len(samples)


def calling(samples: Samples) -> int:
    """Episodes that called the teacher at least once."""
    return sum(s.get("calls", 0) > 0 for s in samples)


# -- the config hash -------------------------------------------------------------------


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of a training config as its run saves it, less UNHASHED. The mapping is read
    as `collab train` reads it, so `collab config show train-METHOD` (every section, `--set`
    text) and the run's own config.yaml (the sections it never reads left out, values
    typed) give one hash for one experiment; key order and YAML spelling do not count."""
    resolved = build_config(GRPOTrainConfig, [config])
    # A document, not a run: its rollout protocol as the method makes it, unchecked.
    protocol = methods.get(resolved.method).rollout(resolved.protocol)
    saved = to_dict(resolved, unread_keys(resolved, protocol))
    kept = {key: value for key, value in saved.items() if key not in UNHASHED}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_file_hash(path: Path) -> str:
    return config_hash(read_yaml(path))


# -- reading a run folder --------------------------------------------------------------


def family_of(item: str, pattern: re.Pattern[str]) -> str:
    match = pattern.search(item)
    return match.group(1) if match else OTHER


def eval_summary(eval_dir: Path, family: re.Pattern[str]) -> Record:
    """A `collab eval` folder as a record holds it: its size, accuracy, each problem's
    correctness and each family's call share."""
    run = load_run(eval_dir)
    by_item = samples_by_item(run)
    if not by_item:
        raise UserError(f"{eval_dir} has no samples", "has the evaluation finished?")
    correct = {item: round(accuracy(by_item[item]), DIGITS) for item in sorted(by_item)}
    called = {
        item: round(calling(by_item[item]) / len(by_item[item]), DIGITS) for item in sorted(by_item)
    }
    families: dict[str, Samples] = defaultdict(list)
    for item, samples in by_item.items():
        families[family_of(item, family)] += samples
    return {
        "n": run["n"],
        "problems": len(correct),
        "accuracy": round(sum(correct.values()) / len(correct), DIGITS),
        "correct": correct,
        "called": called,
        "call_share": {
            name: round(calling(families[name]) / len(families[name]), DIGITS)
            for name in sorted(families)
        },
        "family_episodes": {name: len(families[name]) for name in sorted(families)},
        "family_accuracy": {
            name: round(accuracy(families[name]), DIGITS) for name in sorted(families)
        },
    }


def training_curve(logs: list[Record]) -> list[Record]:
    """The mean of each of CURVE_KEYS per window of steps, from metrics.jsonl's training
    lines (the last one of each step: evaluation and summary lines log none of the keys)."""
    by_step = {
        r["step"]: r
        for r in logs
        if isinstance(r.get("step"), int) and any(key in r for key in CURVE_KEYS.values())
    }
    windows: dict[int, list[Record]] = defaultdict(list)
    for step in sorted(by_step):
        windows[(step - 1) // CURVE_WINDOW].append(by_step[step])
    curve = []
    for window, lines in sorted(windows.items()):
        point: Record = {"steps": f"{window * CURVE_WINDOW + 1}-{(window + 1) * CURVE_WINDOW}"}
        for name, key in CURVE_KEYS.items():
            values = [line[key] for line in lines if _is_number(line.get(key))]
            if values:
                point[name] = round(sum(values) / len(values), DIGITS)
        curve.append(point)
    return curve


def wall_time(logs: list[Record]) -> float | None:
    """TRL's train_runtime, logged once the training loop ends (None: never logged)."""
    times = [r["train_runtime"] for r in logs if "train_runtime" in r]
    return round(float(times[-1]), 1) if times and _is_number(times[-1]) else None


# How runs.provenance writes the commit into config.yaml's header.
COMMIT_LINE = "# git commit: "


def trained_commit(run: Path) -> str | None:
    """The commit in the run's config.yaml header: the code that trained it."""
    for line in (run / runs.CONFIG).read_text(encoding="utf-8").splitlines():
        if line.startswith(COMMIT_LINE):
            return line.removeprefix(COMMIT_LINE).strip()
    return None


def build_record(
    run: Path | None,
    unit: tuple[str, str, int],
    extra_evals: dict[str, Path],
    config_digest: str,
    family: re.Pattern[str],
) -> Record:
    """The record of the finished run folder `run` for `unit` (method, arm, seed), with the
    evaluations in `extra_evals` beside its held-out start and final ones, under the hash
    of the config the unit was planned with, `config_digest`. A unit that trains nothing
    (`run` None: a policy evaluated under several settings) records its evaluations alone."""
    if run is None:
        return evaluation_record(unit, extra_evals, config_digest, family)
    method, arm, seed = unit
    if not (run / EVALUATION).is_file():
        raise UserError(f"{run} has no {EVALUATION}", "has the run finished (with --eval-data)?")
    config = read_yaml(run / runs.CONFIG)
    if config.get("seed") != seed:
        raise UserError(f"{run} trained with seed {config.get('seed')!r}, not {seed}", "fix --seed")
    logs = runs.read_records(run / METRICS)
    folders = {name: run / folder for name, folder in HELD_OUT.items() if (run / folder).is_dir()}
    for name in extra_evals:
        if name in HELD_OUT:
            raise UserError(f"--eval {name} is the run's own held-out evaluation", "rename it")
    record = {
        "schema": RECORD_SCHEMA,
        "method": method,
        "arm": arm,
        "seed": seed,
        "commit": trained_commit(run),
        "config_hash": config_digest,
        "wall_time_s": wall_time(logs),
        "evals": {
            name: eval_summary(path, family) for name, path in {**folders, **extra_evals}.items()
        },
        "curve": training_curve(logs),
    }
    check_record(record, run)
    return record


def evaluation_record(
    unit: tuple[str, str, int],
    evals: dict[str, Path],
    config_digest: str,
    family: re.Pattern[str],
) -> Record:
    """The record of a unit made of evaluations only (a diagnostic of one policy): no
    training curve, and the commit of its first evaluation's header."""
    if not evals:
        raise UserError("a unit without a training run needs an --eval", "pass --eval NAME=DIR")
    method, arm, seed = unit
    first = next(iter(evals.values()))
    record = {
        "schema": RECORD_SCHEMA,
        "method": method,
        "arm": arm,
        "seed": seed,
        "commit": trained_commit(first) if (first / runs.CONFIG).is_file() else None,
        "config_hash": config_digest,
        "wall_time_s": None,
        "evals": {name: eval_summary(path, family) for name, path in evals.items()},
        "curve": [],
    }
    return check_record(record, first)


# -- checking a record -----------------------------------------------------------------

REWRITE = "write it again with scripts/evidence/record.py"


def check_record(record: Any, where: Path) -> Record:
    """`record` if it is one of RECORD_SCHEMA, else a one-line UserError naming `where`."""
    if not isinstance(record, dict):
        raise UserError(f"{where} is not a JSON object", REWRITE)
    if record.get("schema") != RECORD_SCHEMA:
        raise UserError(
            f"{where} has record schema {record.get('schema')!r}; this reads {RECORD_SCHEMA}",
            REWRITE,
        )
    fields: dict[str, type | tuple[type, ...]] = {
        "method": str,
        "arm": str,
        "config_hash": str,
        "commit": (str, type(None)),
        "wall_time_s": (int, float, type(None)),
        "evals": dict,
        "curve": list,
    }
    for key, kind in fields.items():
        _require(where, key, record.get(key), isinstance(record.get(key), kind), "of its type")
    _require(where, "seed", record.get("seed"), _is_whole(record.get("seed")), "a whole number")
    for name, summary in record["evals"].items():
        _check_eval(where, f"evals.{name}", summary)
    for number, point in enumerate(record["curve"]):
        ok = isinstance(point, dict) and isinstance(point.get("steps"), str)
        _require(where, f"curve[{number}]", point, ok, "a window of steps")
    return record


def _check_eval(where: Path, key: str, summary: Any) -> None:
    _require(where, key, summary, isinstance(summary, dict), "a mapping")
    for count in ("n", "problems"):
        value = summary.get(count)
        _require(where, f"{key}.{count}", value, _is_whole(value) and value >= 1, "a count")
    _require(
        where,
        f"{key}.accuracy",
        summary.get("accuracy"),
        _is_share(summary.get("accuracy")),
        "a share",
    )
    # `called`, `family_accuracy` and `family_episodes` may be missing from a hand-made record.
    shared = (("correct", None), ("call_share", None), ("called", {}), ("family_accuracy", {}))
    for part, default in shared:
        shares = summary.get(part, default)
        ok = isinstance(shares, dict) and all(_is_share(v) for v in shares.values())
        _require(where, f"{key}.{part}", shares, ok, "a mapping of shares")
    counts = summary.get("family_episodes", {})
    ok = isinstance(counts, dict) and all(_is_whole(v) and v >= 1 for v in counts.values())
    _require(where, f"{key}.family_episodes", counts, ok, "a mapping of counts")


def _require(where: Path, key: str, value: Any, ok: bool, must: str) -> None:
    if not ok:
        text = json.dumps(value)
        shown = text if len(text) <= 40 else text[:39] + "…"
        raise UserError(f"{where}: {key} is {shown}, not {must}", REWRITE)


def _is_number(value: Any) -> bool:
    """A finite int or float (a JSON `true` is no number)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_share(value: Any) -> bool:
    return _is_number(value) and 0 <= value <= 1


# -- reading the records ---------------------------------------------------------------


def record_path(root: Path, method: str, arm: str, seed: int) -> Path:
    return root / method / arm / f"seed-{seed}.json"


def read_record(path: Path) -> Record:
    """A record file, checked, and refused if its path names another unit (a copied file)."""
    record = check_record(read_json(path, "evidence record", REWRITE), path)
    unit = (record["method"], record["arm"], record["seed"])
    if path.parts[-3:] != record_path(Path(), *unit).parts:
        raise UserError(f"{path} holds the record of {'/'.join(map(str, unit))}", "move it there")
    return record


def read_records(root: Path) -> list[Record]:
    """Every record under `root` (none when it does not exist), in path order."""
    return [read_record(path) for path in sorted(root.glob("*/*/seed-*.json"))]
