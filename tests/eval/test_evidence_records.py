"""Evidence records (collabrl/train/evidence.py): scripts/evidence/record.py writes one from a
finished run folder, and scripts/results_table.py turns the records into the generated
tables of docs/results.md and README.md, or checks them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from collabrl import runs
from collabrl.config import to_dict
from collabrl.eval.metrics import concentration, population_variance, sign_test
from collabrl.eval.report import format_p, format_value
from collabrl.train import evidence
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.resolve import resolve_run
from collabrl.train.run import EVALUATION, METRICS
from tests.eval.evidence import EVIDENCE
from tests.eval.test_relay_seeds import _eval

ROOT = EVIDENCE.parents[1]
RECORD = EVIDENCE / "record.py"
TABLE = ROOT / "scripts" / "results_table.py"


def _script(script: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)], capture_output=True, text=True, check=False
    )


def _refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit status 2 and one line on stderr naming `words`: no traceback."""
    assert done.returncode == 2, done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr


# -- record.py ---------------------------------------------------------------------------


def _config(out: Path, **changes: object) -> GRPOTrainConfig:
    config = GRPOTrainConfig(method="relay", out=str(out), eval_data="arith", steps=6)
    config.protocol.teacher = "reference"
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def _train_run(folder: Path, seed: int = 0) -> Path:
    """A finished relay run folder as `collab train` leaves it: config.yaml (with its
    header), six steps of metrics.jsonl, eval.json and the held-out evaluations."""
    config = _config(folder, seed=seed)
    runs.prepare_folder(config, folder, frozenset(), (), resolve_run(config).unread_keys())
    with runs.RecordWriter(folder / METRICS) as writer:
        for step in range(1, 7):
            writer.write(
                {
                    "step": step,
                    "loss": 0.0,
                    "reward": step / 10,
                    "episodes/accuracy": 0.5,
                    "episodes/calls": float(step),
                    "episodes/consult_rate": 1.0 if step < 5 else 0.0,
                }
            )
            if step == 4:  # a held-out line of --eval-steps: none of the curve's keys
                writer.write({"step": step, "eval/pass@1": 0.9})
        writer.write({"step": 6, "train_runtime": 12.34, "train_loss": 0.0})
    runs.write_json(folder / EVALUATION, {"start": {}, "final": {}})
    _eval(folder / "eval-start", {"add1": [(True, 0), (False, 0)], "add3": [(False, 0)]})
    _eval(folder / "eval-final", {"add1": [(True, 0), (True, 1)], "add3": [(False, 1)]})
    return folder


def test_a_record_holds_the_runs_evaluations_curve_and_provenance(tmp_path: Path) -> None:
    run = _train_run(tmp_path / "run", seed=3)
    _eval(run / "eval-teacher-free", {"add1": [(True, 0), (False, 0)], "add3": [(True, 0)]})
    out = tmp_path / "relay" / "simple" / "seed-3.json"
    done = _script(
        RECORD,
        *(run, "--method", "relay", "--arm", "simple", "--seed", "3"),
        *("--eval", f"teacher_free={run / 'eval-teacher-free'}", "--out", out),
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["schema"] == evidence.RECORD_SCHEMA
    assert (record["method"], record["arm"], record["seed"]) == ("relay", "simple", 3)
    assert record["commit"] == runs.git_commit()  # the header prepare_folder wrote
    assert record["config_hash"] == evidence.config_file_hash(run / runs.CONFIG)
    assert record["wall_time_s"] == 12.3
    assert set(record["evals"]) == {"start", "final", "teacher_free"}
    final = record["evals"]["final"]
    assert final["correct"] == {
        "arith-test-add1-0000": 1.0,
        "arith-test-add1-0001": 1.0,
        "arith-test-add3-0000": 0.0,
    }
    assert (final["n"], final["problems"], final["accuracy"]) == (1, 3, round(2 / 3, 6))
    assert final["call_share"] == {"add1": 0.5, "add3": 1.0}
    assert final["family_episodes"] == {"add1": 2, "add3": 1}
    assert final["family_accuracy"] == {"add1": 1.0, "add3": 0.0}
    # Each problem's share of calling episodes: what a refusal probe reads per problem.
    assert final["called"] == {
        "arith-test-add1-0000": 0.0,
        "arith-test-add1-0001": 1.0,
        "arith-test-add3-0000": 1.0,
    }
    assert record["evals"]["start"]["call_share"] == {"add1": 0.0, "add3": 0.0}
    assert record["evals"]["teacher_free"]["accuracy"] == round(2 / 3, 6)
    # Steps 1-4 and 5-6 (the held-out line at step 4 is not a training line).
    assert record["curve"] == [
        {"steps": "1-4", "reward": 0.25, "accuracy": 0.5, "calls": 2.5, "consult_rate": 1.0},
        {"steps": "5-8", "reward": 0.55, "accuracy": 0.5, "calls": 5.5, "consult_rate": 0.0},
    ]
    assert evidence.read_record(out) == record  # what results_table reads back
    assert out.stat().st_size < 4096


def test_the_family_regex_and_the_planned_hash_are_the_callers(tmp_path: Path) -> None:
    run = _train_run(tmp_path / "run")
    out = tmp_path / "record.json"
    done = _script(
        RECORD,
        *(run, "--method", "relay", "--arm", "simple", "--seed", "0", "--out", out),
        *("--family", r"arith-(\w+)-", "--config-hash", "planned"),
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["evals"]["final"]["call_share"] == {"test": round(2 / 3, 6)}
    assert record["config_hash"] == "planned"
    assert done.stderr == ""  # a unit's argument hash (reproduce.sh): nothing to compare
    planned = "f" * 64  # a config hash (`record.py hash`) that the run's config is not
    done = _script(
        RECORD,
        *(run, "--method", "relay", "--arm", "simple", "--seed", "0", "--out", out),
        *("--config-hash", planned),
    )
    assert f"not the planned {planned}" in done.stderr


def test_a_unit_of_evaluations_alone_and_its_measured_time(tmp_path: Path) -> None:
    # A diagnostic that trains nothing (one policy under several settings) is a unit too.
    _eval(tmp_path / "k8", {"add1": [(True, 1), (False, 1)], "add3": [(False, 0)]})
    _eval(tmp_path / "k128", {"add1": [(True, 1), (True, 1)], "add3": [(True, 1)]})
    out = tmp_path / "record.json"
    args = ("--method", "relay-diag", "--arm", "fixed-k", "--seed", "0", "--out", out)
    evals = ("--eval", f"k8={tmp_path / 'k8'}", "--eval", f"k128={tmp_path / 'k128'}")
    done = _script(RECORD, *args, *evals, "--config-hash", "planned", "--seconds", "61.26")
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert evidence.check_record(record, out) == record
    assert record["curve"] == [] and record["config_hash"] == "planned"
    assert record["wall_time_s"] == 61.3
    assert record["evals"]["k8"]["accuracy"] == round(1 / 3, 6)
    assert record["evals"]["k128"]["accuracy"] == 1.0
    _refused(_script(RECORD, *args, *evals), "--config-hash")  # nothing to hash it by
    _refused(_script(RECORD, *args, "--config-hash", "h"), "--eval")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--seed", "1"), ("seed 0, not 1",)),
        (("--seed", "0", "--eval", "final=x"), ("held-out",)),
        (("--seed", "0", "--eval", "teacher_free=missing"), ("missing",)),
    ],
)
def test_record_refuses_a_wrong_unit_in_one_line(
    tmp_path: Path, args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    run = _train_run(tmp_path / "run")
    done = _script(
        RECORD, run, "--method", "relay", "--arm", "simple", *args, "--out", tmp_path / "r.json"
    )
    _refused(done, *words)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    ("option", "words"),
    [
        (("--eval", "Bad Name=x"), "NAME=FOLDER"),
        (("--family", r"arith-\w+"), "no group"),
        (("--family", "arith-("), "not a regex"),
    ],
)
def test_record_refuses_a_bad_option(tmp_path: Path, option: tuple[str, str], words: str) -> None:
    done = _script(RECORD, tmp_path, "--method", "m", "--arm", "a", "--seed", "0", *option)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert words in done.stderr.splitlines()[-1]  # argparse's usage line, then the error


def test_record_refuses_an_unfinished_run(tmp_path: Path) -> None:
    run = _train_run(tmp_path / "run")
    (run / EVALUATION).unlink()
    done = _script(RECORD, run, "--method", "relay", "--arm", "simple", "--seed", "0")
    _refused(done, EVALUATION, "finished")


# -- the hash ----------------------------------------------------------------------------


def _hash(tmp_path: Path, name: str, config: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))  # as save_config writes it
    done = _script(RECORD, "hash", path)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_hash_is_the_experiments_not_its_folder_seed_or_spelling(tmp_path: Path) -> None:
    config = _config(tmp_path / "a")
    saved = to_dict(config, resolve_run(config).unread_keys())
    first = _hash(tmp_path, "first", saved)
    assert first == _hash(tmp_path, "again", saved)
    assert len(first) == 64
    # Another folder, seed or a resume: the same unit.
    moved = to_dict(_config(tmp_path / "b", seed=7, resume=True), resolve_run(config).unread_keys())
    assert _hash(tmp_path, "moved", moved) == first
    # `collab config show` writes every section, the run's config.yaml those it reads.
    assert _hash(tmp_path, "shown", to_dict(config)) == first
    # Another key order.
    assert _hash(tmp_path, "reordered", dict(reversed(saved.items()))) == first
    # Another learning rate or teacher: another experiment.
    assert _hash(tmp_path, "lr", saved | {"learning_rate": 3e-5}) != first
    teacher = saved | {"protocol": saved["protocol"] | {"teacher": "reference@0.7"}}
    assert _hash(tmp_path, "teacher", teacher) != first


def test_the_hash_refuses_what_is_no_training_config(tmp_path: Path) -> None:
    path = tmp_path / "eval.yaml"
    path.write_text("benchmark: arith\n")
    _refused(_script(RECORD, "hash", path), "benchmark")
    _refused(_script(RECORD, "hash", tmp_path / "missing.yaml"), "missing.yaml")


@pytest.mark.slow  # trains SmolLM2-135M one step and evaluates it twice (~40 s on 2 cores)
def test_a_record_of_a_real_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train = [sys.executable, "-m", "collabrl", "train", "grpo", "--data", "arith_train"]
    train += ["--steps", "1", "--prompts-per-step", "2", "--num-generations", "2"]
    train += ["--max-tokens", "8", "--eval-data", "arith", "--set", "eval_limit=2"]
    trained = subprocess.run([*train, "--out", str(run)], capture_output=True, text=True)
    assert trained.returncode == 0, trained.stderr
    out = tmp_path / "grpo" / "grpo" / "seed-0.json"
    done = _script(RECORD, run, "--method", "grpo", "--arm", "grpo", "--seed", "0", "--out", out)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no planned hash: the run's own, so no note
    record = evidence.read_record(out)
    assert set(record["evals"]) == {"start", "final"}
    assert record["evals"]["final"]["problems"] == 2
    assert record["evals"]["final"]["call_share"] == {"add1": 0.0, "add2": 0.0}
    assert record["config_hash"] == _script(RECORD, "hash", run / runs.CONFIG).stdout.strip()
    assert record["curve"][0]["steps"] == "1-4" and "reward" in record["curve"][0]
    assert record["wall_time_s"] is not None and record["wall_time_s"] > 0


# -- results_table.py --------------------------------------------------------------------


def _record(
    root: Path, arm: str, seed: int, final: dict[str, int], teacher_free: dict[str, int] | None
) -> None:
    """A record of the relay method: `final` (and `teacher_free`) by problem, 1 right."""

    def summary(correct: dict[str, int], calls: float) -> dict:
        return {
            "n": 1,
            "problems": len(correct),
            "accuracy": sum(correct.values()) / len(correct),
            "correct": correct,
            "call_share": {"add1": calls, "add3": 0.0},
        }

    evals = {"start": summary(dict.fromkeys(final, 0), 0.0), "final": summary(final, 0.5)}
    if teacher_free is not None:
        evals["teacher_free"] = summary(teacher_free, 0.0)
    record = {
        "schema": evidence.RECORD_SCHEMA,
        "method": "relay",
        "arm": arm,
        "seed": seed,
        "commit": None,
        "config_hash": "h",
        "wall_time_s": None,
        "evals": evals,
        "curve": [],
    }
    path = evidence.record_path(root, "relay", arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs.write_json(path, record)


def _table_row(text: str, *first: str) -> list[str]:
    """The cells of the markdown row that starts with `first`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[: len(first)] == list(first):
            return cells
    raise AssertionError(f"no row {first} in\n{text}")


@pytest.fixture
def records(tmp_path: Path) -> Path:
    """Two seeds of an arm and of GRPO over four problems; the arm is right on p1 and p2
    in both seeds, GRPO on p3 in both and on p1 in one."""
    root = tmp_path / "evidence"
    arm = {"p1": 1, "p2": 1, "p3": 0, "p4": 0}
    _record(root, "simple", 0, arm, {"p1": 1, "p2": 0, "p3": 0, "p4": 0})
    _record(root, "simple", 1, arm, {"p1": 1, "p2": 1, "p3": 0, "p4": 0})
    _record(
        root, "grpo", 0, {"p1": 1, "p2": 0, "p3": 1, "p4": 0}, {"p1": 0, "p2": 0, "p3": 1, "p4": 0}
    )
    _record(root, "grpo", 1, {"p1": 0, "p2": 0, "p3": 1, "p4": 0}, None)
    return root


def test_the_tables_from_records(records: Path) -> None:
    done = _script(TABLE, "--evidence", records)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    header = _table_row(text, "arm", "seed")
    assert header[2:] == ["start", "final", "teacher_free", "calls add1", "calls add3"]
    assert _table_row(text, "simple", "0")[2:] == ["0.0000", "0.5000", "0.2500", "0.5000", "0.0000"]
    assert _table_row(text, "simple", "mean")[2:5] == ["0.0000", "0.5000", "0.3750"]
    assert _table_row(text, "grpo", "1")[4] == "-"  # no teacher-free evaluation recorded
    assert _table_row(text, "grpo", "mean")[4] == "0.2500"  # of the seed that has one
    # The baseline last; the sign test over problems, correctness averaged over seeds:
    # final, the arm (1, 1, 0, 0) against GRPO (.5, 0, 1, 0): higher on 2, lower on 1.
    assert text.index("| simple | 0 |") < text.index("| grpo | 0 |")
    final = _table_row(text, "simple", "0, 1", "final")
    assert final[3:] == ["4", "0.5000", "0.3750", "2", "1", format_p(sign_test(2, 1))]
    # teacher_free is not in every GRPO seed: no test on it.
    assert "| simple | 0, 1 | teacher_free |" not in text
    assert "| simple | 0, 1 | start |" not in text  # both start from the same policy


def test_an_arm_is_compared_on_the_seeds_both_ran(records: Path) -> None:
    # An arm that has run seed 1 only meets GRPO's seed 1 (right on p3 alone), not the
    # mean over GRPO's two seeds.
    _record(records, "late", 1, {"p1": 1, "p2": 0, "p3": 0, "p4": 0}, None)
    done = _script(TABLE, "--evidence", records)
    assert done.returncode == 0, done.stderr
    final = _table_row(done.stdout, "late", "1", "final")
    assert final[3:] == ["4", "0.2500", "0.2500", "1", "1", format_p(sign_test(1, 1))]


def test_the_concentration_criterion_from_family_counts(tmp_path: Path) -> None:
    # Issue 36's criterion from a record's final call shares and family sizes: 2 of 20
    # add1 episodes call against 30 of 60 on the failed families (half or less, Fisher p
    # small), and for a method whose control is another arm (relay-diag: masked-group).
    root = tmp_path / "evidence"
    shares = {"add1": 0.1, "add2": 0.5, "add3": 0.5, "mul22": 0.5}
    for arm, calls in (("masked-group", shares), ("masked-batch", dict.fromkeys(shares, 1.0))):
        summary = {
            "n": 1,
            "problems": 80,
            "accuracy": 0.5,
            "correct": {"p1": 1},
            "call_share": calls,
            "family_episodes": dict.fromkeys(shares, 20),
            "family_accuracy": {"add1": 0.75, "add3": 0.25},
        }
        record = {
            "schema": evidence.RECORD_SCHEMA,
            "method": "relay-diag",
            "arm": arm,
            "seed": 0,
            "commit": None,
            "config_hash": "h",
            "wall_time_s": None,
            "evals": {"start": summary, "final": summary},
            "curve": [],
        }
        path = evidence.record_path(root, "relay-diag", arm, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        runs.write_json(path, record)
    done = _script(TABLE, "--evidence", root)
    assert done.returncode == 0, done.stderr
    p, shown = concentration((2, 20), (30, 60))
    assert shown and p < 0.05
    # Accuracy per family, each evaluation of each record.
    assert _table_row(done.stdout, "arm", "seed", "eval")[3:] == ["add1", "add3"]
    assert _table_row(done.stdout, "masked-group", "0", "final")[3:] == ["0.7500", "0.2500"]
    table = done.stdout[done.stdout.index("Fisher p") :]  # the criterion's own table
    assert _table_row(table, "masked-group", "0")[2:] == ["0.1000", "0.5000", format_p(p), "yes"]
    assert _table_row(table, "masked-batch", "0")[-1] == "no"  # calls on everything
    assert "masked-group accuracy" in done.stdout  # the method's own control arm


def _document(path: Path, *methods: str) -> Path:
    blocks = "".join(
        f"<!-- results-table:{m} -->\nold\n<!-- /results-table:{m} -->\n" for m in methods
    )
    path.write_text(f"# Results\n\nprose\n\n{blocks}\nmore prose\n")
    return path


def test_write_then_check_and_an_edited_number(records: Path, tmp_path: Path) -> None:
    doc = _document(tmp_path / "results.md", "relay")
    readme = _document(tmp_path / "README.md")  # no block: left alone
    before = readme.read_text()
    files = ("--evidence", records, "--files", doc, readme)
    stale = _script(TABLE, "--check", *files)
    assert stale.returncode == 1
    assert f"{doc}:6: results-table:relay has 'old'" in stale.stdout
    assert _script(TABLE, "--write", *files).returncode == 0
    assert readme.read_text() == before
    text = doc.read_text()
    assert text.startswith("# Results\n\nprose\n\n<!-- results-table:relay -->\n_Generated")
    assert text.endswith("<!-- /results-table:relay -->\n\nmore prose\n")
    ok = _script(TABLE, "--check", *files)
    assert (ok.returncode, ok.stdout) == (
        0,
        "OK: 1 results-table blocks checked, all as the records give\n",
    )
    # A number edited by hand is one line, naming where and what the records give.
    edited = text.replace("| simple | 0 | 0.0000 | 0.5000 |", "| simple | 0 | 0.0000 | 0.6000 |")
    doc.write_text(edited)
    line = edited[: edited.index("0.6000")].count("\n") + 1
    done = _script(TABLE, "--check", *files)
    assert done.returncode == 1
    first, summary = done.stdout.splitlines()
    assert first.startswith(
        f"{doc}:{line}: results-table:relay has '| simple | 0 | 0.0000 | 0.6000"
    )
    assert "the records give '| simple | 0 | 0.0000 | 0.5000" in first
    assert summary.startswith("1 differing line(s)")
    # ... and so is a record that changed under a block.
    _script(TABLE, "--write", *files)
    _record(records, "simple", 2, {"p1": 1, "p2": 1, "p3": 1, "p4": 1}, None)
    assert _script(TABLE, "--check", *files).returncode == 1


def test_check_without_markers_passes(records: Path, tmp_path: Path) -> None:
    doc = _document(tmp_path / "results.md")
    # A marker quoted in a sentence (as results.md explains them) is no block.
    doc.write_text(doc.read_text() + "Between `<!-- results-table:eapo -->` and its end.\n")
    done = _script(TABLE, "--check", "--evidence", records, "--files", doc)
    assert (done.returncode, done.stdout) == (
        0,
        "OK: 0 results-table blocks checked, all as the records give\n",
    )


def test_a_block_without_records_is_an_error(records: Path, tmp_path: Path) -> None:
    doc = _document(tmp_path / "results.md", "relay", "eapo")
    before = doc.read_text()
    for mode in ("--check", "--write"):
        _refused(_script(TABLE, mode, "--evidence", records, "--files", doc), "results-table:eapo")
    assert doc.read_text() == before  # --write changed nothing, the relay block neither


def test_an_unclosed_block_is_an_error(records: Path, tmp_path: Path) -> None:
    doc = tmp_path / "results.md"
    doc.write_text("<!-- results-table:relay -->\nold\n")
    _refused(_script(TABLE, "--check", "--evidence", records, "--files", doc), "without")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda path: path.write_text("{not json"), ("not valid JSON",)),
        (lambda path: path.write_text('{"schema": 99}'), ("schema 99",)),
        (lambda path: _edit(path, seed=True), ("seed",)),
        (
            lambda path: _edit(path, evals={"final": {"n": 1, "problems": 1, "accuracy": 2.0}}),
            ("evals.final.accuracy",),
        ),
        (lambda path: path.rename(path.with_name("seed-9.json")), ("seed-9.json", "relay/grpo/0")),
    ],
)
def test_a_bad_record_is_one_line(
    records: Path, change: Callable[[Path], object], words: tuple[str, ...]
) -> None:
    change(evidence.record_path(records, "relay", "grpo", 0))
    _refused(_script(TABLE, "--evidence", records), *words)


def _edit(path: Path, **fields: object) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


def test_the_repository_tables_are_the_records() -> None:
    """docs/results.md and README.md as committed: every generated block as the committed
    records under docs/evidence/ give it."""
    done = _script(TABLE, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: ")


def test_the_refusal_probe_from_a_records_refused_and_locked_evaluations(tmp_path: Path) -> None:
    # Issue 48's probe: with every answer refused, the episodes of p1, p2, p3 consulted and
    # p1 was still right; locked, p1 and p2 are right: 1 of 3 against 2 of 3, half holds.
    def summary(correct: dict[str, int], called: dict[str, int]) -> dict:
        return {
            "n": 1,
            "problems": len(correct),
            "accuracy": sum(correct.values()) / len(correct),
            "correct": correct,
            "called": called,
            "call_share": {"add1": sum(called.values()) / len(called)},
        }

    refused = summary({"p1": 1, "p2": 0, "p3": 0, "p4": 1}, {"p1": 1, "p2": 1, "p3": 1, "p4": 0})
    locked = summary(
        {"p1": 1, "p2": 1, "p3": 0, "p4": 0}, dict.fromkeys(("p1", "p2", "p3", "p4"), 0)
    )
    record = {
        "schema": evidence.RECORD_SCHEMA,
        "method": "eapo-probe",
        "arm": "three-outcome",
        "seed": 0,
        "commit": None,
        "config_hash": "h",
        "wall_time_s": None,
        "evals": {"accepted": locked, "refused": refused, "locked": locked},
        "curve": [],
    }
    path = evidence.record_path(tmp_path, "eapo-probe", "three-outcome", 0)
    path.parent.mkdir(parents=True)
    runs.write_json(path, record)
    done = _script(TABLE, "--evidence", tmp_path)
    assert done.returncode == 0, done.stderr
    row = _table_row(done.stdout, "three-outcome", "0.5000")
    assert row[4:] == ["3 of 4", "1 of 3", "2 of 3", "yes"]


def test_consultation_fades_from_a_records_curve(tmp_path: Path) -> None:
    # EAPO's criterion (c): the last window's consultation rate at most half the first's.
    # Its evaluations lock the channel: no call shares, no concentration criterion.
    summary = {
        "n": 32,
        "problems": 1,
        "accuracy": 0.5,
        "correct": {"p1": 0.5},
        "call_share": {"add1": 0.0, "add3": 0.0},
        "family_episodes": {"add1": 16, "add3": 16},
    }
    # eapo-anneal sends no query in its last steps, but only because its turn budget of 1
    # cut every call it wrote (0.6 of episodes): no fade.
    ends = {
        "eapo-fixed": {"consult_rate": 0.2, "turn_budget": 2},
        "eapo-anneal": {"consult_rate": 0.0, "budget_cut": 0.6, "turn_budget": 1},
    }
    for arm, last in ends.items():
        curve = [
            {"steps": "1-4", "consult_rate": 0.8, "turn_budget": 2},
            {"steps": "5-8", "consult_rate": 0.6, "turn_budget": 2},
            {"steps": "13-16", **last},
        ]
        record = {
            "schema": evidence.RECORD_SCHEMA,
            "method": "eapo48",
            "arm": arm,
            "seed": 1,
            "commit": None,
            "config_hash": "h",
            "wall_time_s": None,
            "evals": {"final": summary, "pass32": summary},
            "curve": curve,
        }
        path = evidence.record_path(tmp_path, "eapo48", arm, 1)
        path.parent.mkdir(parents=True)
        runs.write_json(path, record)
    done = _script(TABLE, "--evidence", tmp_path)
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("fades (≤ 0.5)") :]
    fixed = ["0.8000", "0.2000", "2", "0.2500", "yes"]
    assert _table_row(table, "eapo-fixed", "1")[2:] == fixed
    assert _table_row(table, "eapo-anneal", "1")[2:] == ["0.8000", "0.6000", "1", "0.7500", "no"]
    assert _table_row(done.stdout, "arm", "seed")[2:] == ["start", "final", "pass32"]
    assert "calls add1" not in done.stdout and "Fisher p" not in done.stdout


def test_rsim_sets_evaluations_of_one_record_against_each_other(tmp_path: Path) -> None:
    # rSIM's criteria (2) and (3) within each seed's record: final against start, the
    # trained planner's plug-in against PS+. Two seeds over three problems: seed 0's plug-in
    # is right on p1 and p2, seed 1's on p1; PS+ (greedy, the same in both) on p3.
    def summary(correct: dict[str, int]) -> dict:
        accuracy = sum(correct.values()) / len(correct)
        return {"n": 1, "problems": 3, "accuracy": accuracy, "correct": correct, "call_share": {}}

    ps_plus = {"p1": 0, "p2": 0, "p3": 1}
    plug_ins = {0: {"p1": 1, "p2": 1, "p3": 0}, 1: {"p1": 1, "p2": 0, "p3": 0}}
    for seed, plug_in in plug_ins.items():
        evals = {"start": summary(ps_plus), "final": summary(plug_in)}
        evals |= {"plug_in": summary(plug_in), "ps_plus": summary(ps_plus)}
        record = {"schema": evidence.RECORD_SCHEMA, "method": "rsim-band", "arm": "joint"}
        record |= {"seed": seed, "commit": None, "config_hash": "h", "wall_time_s": None}
        path = evidence.record_path(tmp_path, "rsim-band", "joint", seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        runs.write_json(path, record | {"evals": evals, "curve": []})
    done = _script(TABLE, "--evidence", tmp_path)
    assert done.returncode == 0, done.stderr
    # Summed over seeds: higher on p1, p2 (seed 0) and p1 (seed 1), lower on p3 twice;
    # once a problem (means 1, .5, 0 against 0, 0, 1): higher on 2, lower on 1.
    row = _table_row(done.stdout, "joint", "0, 1", "plug_in", "ps_plus")
    assert row[4:] == ["3", "0.5000", "0.3333", "3 / 2", format_p(sign_test(3, 2))] + [
        "2 / 1",
        format_p(sign_test(2, 1)),
    ]
    assert _table_row(done.stdout, "joint", "0, 1", "final", "start")[7] == "3 / 2"
    # No untrained-planner evaluation recorded: no row for it; no calls to count.
    assert "untrained" not in done.stdout and "calls " not in done.stdout


def _eapo_record(root: Path, arm: str, seed: int, pass32: dict[str, float], rates: tuple) -> None:
    """An eapo48 record: `pass32` by problem, its consultation rate in steps 1-4 and 13-16."""
    summary = {"n": 32, "problems": len(pass32), "correct": pass32, "call_share": {}}
    summary["accuracy"] = sum(pass32.values()) / len(pass32)
    curve = [
        {"steps": f"{a}-{a + 3}", "consult_rate": r} for a, r in zip((1, 13), rates, strict=True)
    ]
    record = {"schema": evidence.RECORD_SCHEMA, "method": "eapo48", "arm": arm, "seed": seed}
    record |= {"commit": None, "config_hash": "h", "wall_time_s": None}
    path = evidence.record_path(root, "eapo48", arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    runs.write_json(path, record | {"evals": {"pass32": summary}, "curve": curve})


def test_eapos_criteria_are_open_until_three_seeds_then_read_off_the_records(
    tmp_path: Path,
) -> None:
    # EAPO above GRPO on 6 of 8 problems in seeds 0 and 1, below on all 8 in seed 2, by
    # a little: above in 2 of 3 seeds; pooled (means over seeds) above on 6, below on 2.
    problems = [f"p{i}" for i in range(8)]
    grpo = dict.fromkeys(problems, 0.5)
    better = {p: 0.75 if i < 6 else 0.25 for i, p in enumerate(problems)}
    worse = dict.fromkeys(problems, 0.4375)
    for seed, pass32 in enumerate([better, better, worse]):
        _eapo_record(tmp_path, "grpo", seed, grpo, (0.0, 0.0))
        if seed < 2:  # first two seeds of EAPO: open, whatever they show
            _eapo_record(tmp_path, "eapo-fixed", seed, pass32, (0.8, 0.2))
    done = _script(TABLE, "--evidence", tmp_path)
    assert done.returncode == 0, done.stderr
    criteria = done.stdout[done.stdout.index("pooled sign test p") :]
    row = _table_row(criteria, "eapo-fixed", "0, 1")
    assert row[2] == "2 of 2" and row[4] == "open (2 of 3 seeds)" and row[8] == row[4]
    # An arm that consults on in both seeds cannot fade in 2 of 3, whatever its third does.
    _eapo_record(tmp_path, "eapo-anneal", 0, better, (0.8, 0.8))
    _eapo_record(tmp_path, "eapo-anneal", 1, better, (0.8, 0.9))
    done = _script(TABLE, "--evidence", tmp_path)
    criteria = done.stdout[done.stdout.index("pooled sign test p") :]
    row = _table_row(criteria, "eapo-anneal", "0, 1")
    assert row[4] == "open (2 of 3 seeds)"
    assert row[8] == "not shown (0 of 2: cannot reach 2 of 3)"

    _eapo_record(tmp_path, "eapo-fixed", 2, worse, (0.8, 0.6))
    done = _script(TABLE, "--evidence", tmp_path)
    row = _table_row(
        done.stdout[done.stdout.index("pooled sign test p") :], "eapo-fixed", "0, 1, 2"
    )
    # Means over seeds: p0-p5 (.75 + .75 + .4375) / 3 > .5, p6-p7 below: 6 to 2, p = 0.29.
    assert row[2:5] == ["2 of 3", format_p(sign_test(6, 2)), "not shown"]
    var = (2 * population_variance(list(better.values())) + 0.0) / 3  # `worse` is flat
    assert row[5:7] == [format_value(var), "0.0000"]  # GRPO is flat
    assert row[7:] == ["2 of 3", "shown"]  # fades in seeds 0 and 1 (0.25), not 2 (0.75)
