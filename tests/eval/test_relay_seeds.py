"""scripts/evidence/relay_seeds.py: the relay runs across seeds (where the calls go and the
pre-registered criterion, Table 4 against GRPO, and the rollouts that explain them)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from collabrl import runs
from collabrl.config import DecodingConfig, save_config
from collabrl.episode import Author, Episode, Segment
from collabrl.errors import UserError
from collabrl.eval.report import format_p
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.rollout import RolloutBatch, RolloutLog, Scores
from collabrl.train.run import ROLLOUTS
from tests.eval.evidence import EVIDENCE, load_script
from tests.eval.test_report import _run

SCRIPT = EVIDENCE / "relay_seeds.py"
FAMILIES = ("add1", "add2", "mul22", "add3")


def _eval(folder: Path, samples: dict[str, list[tuple[bool, int]]]) -> None:
    """A `collab eval` folder, one sample a problem: `samples[family]` holds each of that
    family's problems as (correct, calls)."""
    _run(folder, "m", 1, {}, protocol="relay")
    with runs.RecordWriter(folder / runs.SAMPLES) as writer:
        for fam, problems in samples.items():
            for i, (correct, calls) in enumerate(problems):
                item = f"arith-test-{fam}-{i:04d}"
                completion = "<call>5</call>" * calls
                record = {"item_id": item, "sample": 0, "correct": correct, "calls": calls}
                writer.write(record | {"completion": completion})


def _calls(called: int, total: int) -> list[tuple[bool, int]]:
    """`total` problems of a family, the first `called` of them calling (all right)."""
    return [(True, int(i < called)) for i in range(total)]


def _one_sided_fisher(failed: int, failed_n: int, solved: int, solved_n: int) -> float:
    """P(failed families call at least this often | all margins), the hypergeometric tail."""
    calls, n = failed + solved, failed_n + solved_n
    tail = range(failed, min(calls, failed_n) + 1)
    return sum(math.comb(failed_n, k) * math.comb(solved_n, calls - k) for k in tail) / math.comb(
        n, calls
    )


def test_the_criterion_needs_both_the_halved_share_and_the_fisher_test(tmp_path: Path) -> None:
    script = load_script("relay_seeds")
    with_teacher = {
        # add1 1/10 calls, the others 20/30: concentrates.
        ("difficulty_aware", "0"): [_calls(1, 10), _calls(7, 10), _calls(6, 10), _calls(7, 10)],
        # 5/10 and 15/30: the same share, does not.
        ("difficulty_aware", "1"): [_calls(5, 10), _calls(5, 10), _calls(5, 10), _calls(5, 10)],
        # 0/2 and 1/6: at most half, but p = 0.75 on so few.
        ("simple", "0"): [_calls(0, 2), _calls(1, 2), _calls(0, 2), _calls(0, 2)],
        ("simple", "1"): [_calls(0, 2), _calls(1, 2), _calls(0, 2), _calls(0, 2)],
    }
    for (arm, seed), families in with_teacher.items():
        _eval(
            tmp_path / f"{arm}-seed{seed}" / script.WITH_TEACHER,
            dict(zip(FAMILIES, families, strict=True)),
        )
    header, rows = script.call_table(tmp_path, ["0", "1"])
    table = {(row[0], row[1]): dict(zip(header, row, strict=True)) for row in rows}

    p0 = _one_sided_fisher(20, 30, 1, 10)
    assert p0 < 0.05
    assert table["difficulty_aware", "0"] == {
        "arm": "difficulty_aware",
        "seed": "0",
        "add1 acc (calls)": "1.0000 (0.1000)",
        "add2 acc (calls)": "1.0000 (0.7000)",
        "mul22 acc (calls)": "1.0000 (0.6000)",
        "add3 acc (calls)": "1.0000 (0.7000)",
        "calls add1": "0.1000",
        "calls add2+mul22+add3": "0.6667",
        "Fisher p": format_p(p0),
        "concentrates": "true",
        "opened add1": "0.1000",
        "opened add2+mul22+add3": "0.6667",
    }
    p1 = _one_sided_fisher(15, 30, 5, 10)
    assert table["difficulty_aware", "1"]["Fisher p"] == format_p(p1)
    assert table["difficulty_aware", "1"]["concentrates"] == "false"
    assert table["simple", "0"]["Fisher p"] == "0.7500"  # 6 of the 8 episodes are "failed"
    assert table["simple", "0"]["concentrates"] == "false"

    # Pooled: the calls summed over seeds, and Fisher's method: -2 Σ ln p against χ² with
    # 4 degrees of freedom, whose tail is exp(-x/2) (1 + x/2).
    x = -2 * (math.log(p0) + math.log(p1))
    pooled = table["difficulty_aware", "pooled"]
    assert pooled["calls add1"] == "0.3000"  # (1 + 5) / 20
    assert pooled["calls add2+mul22+add3"] == "0.5833"  # (20 + 15) / 60
    assert pooled["Fisher p"] == format_p(math.exp(-x / 2) * (1 + x / 2))
    assert pooled["concentrates"] == "1/2 seeds"
    assert table["simple", "pooled"]["concentrates"] == "0/2 seeds"


def _alone(folder: Path, right: list[int]) -> None:
    """A teacher-free evaluation of one problem a family, `right[i]` for family i."""
    _eval(folder, {fam: [(bool(r), 0)] for fam, r in zip(FAMILIES, right, strict=True)})


def test_table_4_and_the_sign_test_against_grpo(tmp_path: Path) -> None:
    script = load_script("relay_seeds")
    _alone(tmp_path / script.WARMUP_ALONE, [1, 0, 0, 0])
    alone = {
        "difficulty_aware": ([1, 1, 0, 0], [1, 0, 1, 0]),  # per problem over seeds: 1 .5 .5 0
        "simple": ([1, 0, 0, 0], [0, 0, 0, 0]),  # .5 0 0 0
        "grpo": ([1, 0, 0, 0], [0, 0, 1, 0]),  # .5 0 .5 0
    }
    for arm, by_seed in alone.items():
        for seed, right in enumerate(by_seed):
            _alone(tmp_path / f"{arm}-seed{seed}" / script.ALONE, right)

    header, rows = script.alone_table(tmp_path, ["0", "1"])
    assert header == ["policy", *FAMILIES, "overall"]
    assert rows[0] == ["warm-up", "1.0000", "0.0000", "0.0000", "0.0000", "0.2500"]
    assert rows[-1] == ["grpo-seed1", "0.0000", "0.0000", "1.0000", "0.0000", "0.2500"]
    assert len(rows) == 7

    header, rows = script.against_grpo(tmp_path, ["0", "1"])
    table = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    # difficulty_aware - grpo per problem: +.5 +.5 0 0: 2 higher, 0 lower, p = 2 / 2^2.
    assert table["difficulty_aware"] == {
        "arm": "difficulty_aware",
        "problems": "4",
        "arm accuracy": "0.5000",
        "GRPO accuracy": "0.2500",
        "arm higher": "2",
        "GRPO higher": "0",
        "sign test p": "0.5000",
        "seeds arm >= GRPO": "2/2",  # .5 >= .25 twice
    }
    # simple - grpo: 0 0 -.5 0: GRPO higher on one problem; seeds .25 >= .25 but 0 < .25.
    assert [table["simple"][k] for k in ("arm higher", "GRPO higher", "sign test p")] == [
        "0",
        "1",
        "1.0000",
    ]
    assert table["simple"]["seeds arm >= GRPO"] == "1/2"


def _episode(problem: str, calls: int) -> Episode:
    segments = [Segment(Author.POLICY, "a", [1], [0.0])]
    segments += [Segment(Author.TEACHER, "b", [2]) for _ in range(calls)]
    return Episode(problem, [0], segments, answer="1")


def _rollouts(run: Path, step: int, group: list[tuple[str, bool, int, float | None]]) -> None:
    """One step of rollouts.jsonl, written by the trainer's own log: each episode as
    (family, correct, calls, call_cost part)."""
    run.mkdir(parents=True, exist_ok=True)
    episodes = [_episode(f"arith-train-{fam}-0000", calls) for fam, _, calls, _ in group]
    output = {"correct": [c for _, c, _, _ in group], "calls": [n for _, _, n, _ in group]}
    scores = [
        Scores(float(c), {"relay_difficulty_aware": float(c), "call_cost": cost}, 0.0)
        for _, c, _, cost in group
    ]
    RolloutLog(run / ROLLOUTS, keep=len(group)).write(step, RolloutBatch(episodes, output), scores)


def _config(run: Path, save_rollouts: int) -> None:
    """The run's config.yaml as `collab train relay` saves it: 2 prompts of 4 samples a step."""
    run.mkdir(parents=True)
    config = GRPOTrainConfig(
        method="relay",
        prompts_per_step=2,
        sampling=DecodingConfig(n=4),
        save_rollouts=save_rollouts,
    )
    save_config(config, run / runs.CONFIG)


def test_the_rollout_table_counts_calls_rewards_and_group_composition(
    tmp_path: Path, capsys
) -> None:
    script = load_script("relay_seeds")
    run = tmp_path / "difficulty_aware-seed0"
    _config(run, save_rollouts=6)  # fewer than the batch's 8: a note
    _config(tmp_path / "simple-seed0", save_rollouts=8)  # all of it: none
    # Step 1: add2's group is mixed, its callers right (2/2) and its non-callers not (1/2);
    # add1's group all succeed without a call.
    _rollouts(
        run,
        1,
        [("add2", True, 1, -0.1), ("add2", True, 2, -0.2), ("add2", False, 0, None)]
        + [("add2", True, 0, 0.0), ("add1", True, 0, 0.0), ("add1", True, 0, 0.0)],
    )
    # Step 2, same window: add2 all fail, one caller; a lone add1 sample (no group).
    _rollouts(run, 2, [("add2", False, 1, -0.1), ("add2", False, 0, 0.0), ("add1", False, 0, 0.0)])
    # Step 5, the next window: a mixed add2 group where the non-caller was right.
    _rollouts(run, 5, [("add2", False, 1, -0.1), ("add2", True, 0, 0.0)])
    _rollouts(tmp_path / "simple-seed0", 1, [("add1", True, 0, 0.0)])

    header, rows = script.rollout_table(tmp_path, ["0"])
    assert capsys.readouterr().err == (
        f"note: {run} kept 6 of the 8 episodes of each step (save_rollouts): its groups and "
        "call shares are partial; train with --set save_rollouts=8\n"
    )
    table = {(row[0], row[1], row[2]): dict(zip(header, row, strict=True)) for row in rows}
    assert list(table) == [
        ("difficulty_aware", "add1", "1-4"),
        ("difficulty_aware", "add2", "1-4"),
        ("difficulty_aware", "add2", "5-8"),
        ("simple", "add1", "1-4"),
    ]
    assert table["difficulty_aware", "add2", "1-4"] == {
        "arm": "difficulty_aware",
        "family": "add2",
        "steps": "1-4",
        "episodes": "6",
        "call share": "0.5000",  # 3 of 6 called
        "callers' accuracy": "2/3",
        "non-callers' accuracy": "1/3",
        "teacher tokens a caller": "1.3333",  # one token a call: 1, 2, 1
        "reward call_cost": "-0.0800",  # (-.1 -.2 + 0 -.1 + 0) / 5: the None left out
        "reward relay_difficulty_aware": "0.5000",
        "groups": "2",
        "samples/group": "3.0000",
        "all fail": "0.5000",
        "mixed": "0.5000",
        "all succeed": "0.0000",
        "callers right": "1/1",
        "non-callers right": "0/1",
    }
    add1 = table["difficulty_aware", "add1", "1-4"]
    # The lone step-2 sample is no group; the step-1 pair all succeed, no mixed group.
    assert [add1[k] for k in ("episodes", "groups", "all succeed", "callers right")] == [
        "3",
        "1",
        "1.0000",
        "0/0",
    ]
    later = table["difficulty_aware", "add2", "5-8"]
    assert [later["mixed"], later["callers right"], later["non-callers right"]] == [
        "1.0000",
        "0/1",
        "1/1",
    ]


def test_a_missing_run_folder_is_named_in_one_line(tmp_path: Path) -> None:
    script = load_script("relay_seeds")
    _rollouts(tmp_path / "difficulty_aware-seed0", 1, [("add1", True, 0, 0.0)])
    with pytest.raises(UserError, match=f"{tmp_path / 'simple-seed0' / ROLLOUTS} is missing"):
        script.rollout_table(tmp_path, ["0"])
    with pytest.raises(UserError, match="eval-final is not a folder"):
        script.call_table(tmp_path, ["0"])

    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "0"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "eval-final is not a folder" in done.stderr
    assert "Traceback" not in done.stderr


def test_relay_arms_tables_only_the_arms_that_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """reproduce.sh's RELAY_ARMS: a partial run (one relay arm, no GRPO) is tabled as it
    is, without asking for the folders of the arms that did not run."""
    monkeypatch.setenv("RELAY_ARMS", "difficulty_aware")
    script = load_script("relay_seeds")
    run = tmp_path / "difficulty_aware-seed0"
    _alone(tmp_path / script.WARMUP_ALONE, [1, 0, 0, 0])
    _alone(run / script.ALONE, [1, 1, 0, 0])
    _eval(run / script.WITH_TEACHER, {fam: _calls(1, 2) for fam in FAMILIES})
    _rollouts(run, 1, [("add1", True, 0, 0.0), ("add2", False, 1, -0.1)])

    script.main(tmp_path, ["0"])
    printed = capsys.readouterr().out
    assert "difficulty_aware-seed0" in printed and "against GRPO" not in printed
    assert "simple" not in printed and "grpo" not in printed


def test_an_unclosed_call_is_no_call_but_shows_as_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy that pads n with digits to the budget leaves its call unclosed: the
    criterion counts no call there, and the opened share shows the attempt."""
    monkeypatch.setenv("RELAY_ARMS", "difficulty_aware")
    script = load_script("relay_seeds")
    run = tmp_path / "difficulty_aware-seed0"
    _eval(run / script.WITH_TEACHER, {fam: _calls(1, 2) for fam in FAMILIES})
    unclosed = {"item_id": "arith-test-add1-0009", "sample": 0, "correct": False, "calls": 0}
    with (run / script.WITH_TEACHER / runs.SAMPLES).open("a", encoding="utf-8") as samples:
        samples.write(json.dumps(unclosed | {"completion": "To solve<call>19891422"}) + "\n")

    header, rows = script.call_table(tmp_path, ["0"])
    row = dict(zip(header, rows[0], strict=True))
    assert row["calls add1"] == "0.3333"  # 1 of 3 answered
    assert row["opened add1"] == "0.6667"  # 2 of 3 wrote <call>
