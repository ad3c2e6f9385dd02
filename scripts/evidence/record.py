"""Write the evidence record of one finished training run (collabrl/train/evidence.py says
what it holds), or print the config hash a unit is planned with:

    python scripts/evidence/record.py [RUN] --method METHOD --arm ARM --seed N
        [--eval NAME=EVAL_FOLDER ...] [--config-hash HASH] [--seconds S] [--family REGEX]
        [--out FILE]
    python scripts/evidence/record.py hash CONFIG.yaml

RUN is a `collab train` folder that finished its held-out evaluation (eval.json); its
eval-start/ and eval-final/ are recorded as "start" and "final", and each --eval NAME=FOLDER
(a `collab eval` folder, e.g. teacher_free=RUN/eval-teacher-free) as NAME; without RUN
the unit is its --eval folders alone (a policy evaluated under several settings, with
--config-hash required). --seconds is the unit's whole time (default: TRL's training
loop time). --family is the
regex whose first group is a problem's family, for the call shares. --config-hash is the
hash reproduce.sh planned the unit with (default: the hash of RUN/config.yaml). --out
defaults to docs/evidence/METHOD/ARM/seed-N.json.

`hash CONFIG.yaml` prints the hash of a training config (the run's config.yaml, or `collab
config show train-METHOD` output): sha256 of the config as the run saves it, less its
output folder, seed and resume flag. A bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from collabrl import runs
from collabrl.errors import UserError
from collabrl.train import evidence

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence"
NAME = re.compile(r"[a-z0-9_]+")  # an evaluation's name in a record and in table headers


def named_eval(text: str) -> tuple[str, Path]:
    """`NAME=FOLDER`, refused unless NAME is a plain word and FOLDER is given."""
    name, _, folder = text.partition("=")
    if not NAME.fullmatch(name) or not folder:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=FOLDER (NAME of a-z, 0-9, _)")
    return name, Path(folder)


def pattern(text: str) -> re.Pattern[str]:
    try:
        compiled = re.compile(text)
    except re.error as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regex: {err}") from err
    if compiled.groups < 1:
        raise argparse.ArgumentTypeError(f"{text!r} has no group to read the family from")
    return compiled


def record_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="record.py", description="Write a finished run's evidence record."
    )
    parser.add_argument(
        "run", type=Path, nargs="?", help="the finished `collab train` folder (none: evals only)"
    )
    parser.add_argument("--method", required=True)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--eval", type=named_eval, action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--config-hash", help="the hash the unit was planned with")
    parser.add_argument("--seconds", type=float, help="the unit's time, as its runner measured")
    parser.add_argument("--family", type=pattern, default=pattern(evidence.FAMILY))
    parser.add_argument("--out", type=Path, help="default: docs/evidence/METHOD/ARM/seed-N.json")
    return parser


def write(args: argparse.Namespace) -> Path:
    extra = dict(args.eval)
    if len(extra) < len(args.eval):
        raise UserError("an --eval NAME is given twice", "name each evaluation once")
    if args.run is None and args.config_hash is None:
        raise UserError("a unit without a run needs --config-hash", "pass the unit's hash")
    own = (
        args.config_hash if args.run is None else evidence.config_file_hash(args.run / runs.CONFIG)
    )
    # A plan made with `record.py hash` is a config hash and can be checked against the run;
    # reproduce.sh's units are planned by their arguments' hash, which is another kind.
    planned_config = args.config_hash is not None and len(args.config_hash) == len(own)
    if planned_config and args.config_hash != own:  # the planned config is not what ran
        print(
            f"note: {args.run / runs.CONFIG} hashes to {own}, not the planned "
            f"{args.config_hash}: the run resolved a value the plan left open (--steps 0?)",
            file=sys.stderr,
        )
    unit = (args.method, args.arm, args.seed)
    record = evidence.build_record(args.run, unit, extra, args.config_hash or own, args.family)
    if args.seconds is not None:
        record["wall_time_s"] = round(args.seconds, 1)
    out = args.out or evidence.record_path(EVIDENCE, *unit)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        runs.write_json(out, record)
    except OSError as err:
        raise UserError(f"cannot write {out}: {err.strerror or err}", "pass another --out") from err
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["hash"]:
        if len(argv) != 2:
            raise UserError("hash takes one CONFIG.yaml", "usage: record.py hash CONFIG.yaml")
        print(evidence.config_file_hash(Path(argv[1])))
        return
    print(f"wrote {write(record_parser().parse_args(argv))}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UserError as err:  # bad input: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
