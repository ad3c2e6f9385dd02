"""scripts/evidence/eapo_seeds.py: EAPO against its GRPO baseline across seeds (Pass@32,
Var, the pooled sign test) and the consultation rate per step (Figure 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl import runs
from collabrl.episode import Author, Episode, Segment
from collabrl.eval.metrics import ProblemSamples, summarize
from collabrl.train.rollout import RolloutBatch, RolloutLog, Scores
from collabrl.train.run import ROLLOUTS
from tests.eval.evidence import load_script
from tests.eval.test_report import _run


def _eval(folder: Path, f1s: list[list[float]]) -> None:
    """A `collab eval` folder whose problem i has the sample F1s `f1s[i]`."""
    problems = [
        ProblemSamples(f"q{i}", [f == 1 for f in v], v, ["1"] * len(v)) for i, v in enumerate(f1s)
    ]
    _run(folder, "m", len(f1s[0]), summarize(problems), protocol="consult")
    with (folder / runs.SAMPLES).open("w") as out:
        for i, values in enumerate(f1s):
            for sample, f1 in enumerate(values):
                record = {"item_id": f"q{i}", "sample": sample, "correct": f1 == 1.0, "f1": f1}
                out.write(json.dumps(record) + "\n")


def test_the_pooled_test_averages_each_problem_over_seeds(tmp_path: Path, capsys) -> None:
    script = load_script("eapo_seeds")
    # Three problems, two seeds. EAPO - GRPO per problem: q0 +0.5 and +0.5 (higher),
    # q1 -0.5 and +0.5 (mean 0: a tie), q2 -1 and 0 (GRPO higher).
    eapo = {"0": [[1, 1], [0, 0], [0, 0]], "1": [[1, 1], [1, 1], [0.5, 0.5]]}
    grpo = {"0": [[0.5, 0.5], [0.5, 0.5], [1, 1]], "1": [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]}
    for seed in ("0", "1"):
        _eval(tmp_path / f"eapo-seed{seed}" / script.EVAL, eapo[seed])
        _eval(tmp_path / f"grpo-seed{seed}" / script.EVAL, grpo[seed])
    # Pass@2 per seed: EAPO 1/3 and 2/3, GRPO 2/3 and 1/2; Var = mean squared deviation.
    _, rows = script.seed_table(tmp_path, ["0", "1"])
    assert rows == [
        ["0", "0.3333", "0.6667", "0.2222", "0.0556", "false", "false"],
        ["1", "0.8333", "0.5000", "0.0556", "0.0000", "true", "false"],
        ["share", "", "", "", "", "1/2", "0/2"],
    ]
    header, [row] = script.pooled_test(tmp_path, ["0", "1"])
    assert dict(zip(header, row, strict=True)) == {
        "problems": "3",
        "mean F1 difference": "0.0000",  # (0.5 + 0 - 0.5) / 3
        "EAPO higher": "1",
        "GRPO higher": "1",
        "sign test p": "1.0000",
    }


def test_the_rate_table_windows_each_seeds_steps(tmp_path: Path) -> None:
    script = load_script("eapo_seeds")
    run = tmp_path / "eapo-seed0"
    run.mkdir()
    lines = [{"step": s, "loss": 0.0, script.RATE: r} for s, r in enumerate([1, 1, 0.5, 0.5, 0], 1)]
    lines.insert(1, {"step": 1, "eval/pass@1": 0.1})  # an evaluation line: no rate
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    _, rows = script.rate_table(tmp_path, ["0"])
    assert rows == [["0", "1-4", "0.7500"], ["0", "5-5", "0.0000"]]
    script.plot_rates(tmp_path, ["0"], tmp_path / "rate.png")
    assert (tmp_path / "rate.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("missing", ["eapo", "grpo"])
def test_a_seed_without_its_evaluation_is_a_user_error(tmp_path: Path, missing: str) -> None:
    from collabrl.errors import UserError

    script = load_script("eapo_seeds")
    other = "grpo" if missing == "eapo" else "eapo"
    _eval(tmp_path / f"{other}-seed0" / script.EVAL, [[1.0]])
    with pytest.raises(UserError):
        script.seed_table(tmp_path, ["0"])


def _consulting(accepted: list[bool]) -> Episode:
    """An episode that sent one query a flag (none: it did not consult), each answer let in
    by rho or not."""
    segments = [Segment(Author.POLICY, "a", [1], [0.0])]
    segments += [Segment(Author.EXPERT, "b", [2], None, {"accepted": a}) for a in accepted]
    return Episode("arith-train-add1-0000", [0], segments, answer="1")


def _step(run: Path, step: int, group: list[tuple[list[bool], bool, float]]) -> None:
    """One step of rollouts.jsonl, written by the trainer's own log: each episode as
    (its answers let in or not, correct, advantage); the reward is 1 if correct else 0.1."""
    episodes = [_consulting(accepted) for accepted, _, _ in group]
    output = {"correct": [c for _, c, _ in group], "calls": [len(a) for a, _, _ in group]}
    scores = [Scores(1.0 if c else 0.1, {"eapo": None}, adv) for _, c, adv in group]
    RolloutLog(run / ROLLOUTS, keep=len(group)).write(step, RolloutBatch(episodes, output), scores)


def test_the_why_table_splits_consulting_episodes_by_what_rho_let_in(tmp_path: Path) -> None:
    script = load_script("eapo_seeds")
    for seed in ("0", "1"):
        (tmp_path / f"eapo-seed{seed}").mkdir()
    # Steps 1 and 4 (one window, two seeds): an answer let in and right (+1); one refused
    # of two queries, the other let in, wrong (-0.5); all refused (-0.5); alone, right (0).
    _step(tmp_path / "eapo-seed0", 1, [([True], True, 1.0), ([False, True], False, -0.5)])
    _step(tmp_path / "eapo-seed1", 4, [([False], False, -0.5), ([], True, 0.0)])
    _step(tmp_path / "eapo-seed1", 5, [([], False, 0.0)])  # the next window: alone only
    header, rows = script.why_table(tmp_path, ["0", "1"])
    first, second = (dict(zip(header, row, strict=True)) for row in rows)
    assert first == {
        "steps": "1-4",
        "episodes": "4",
        "consulted": "3",
        "consulted: right": "1/3",
        "consulted: reward": "0.4000",  # (1 + 0.1 + 0.1) / 3
        "consulted: advantage": "0.0000",
        "did not: right": "1/1",
        "did not: reward": "1.0000",
        "did not: advantage": "0.0000",
        "answer let in: right": "1/2",
        "answer let in: reward": "0.5500",
        "answer let in: advantage": "0.2500",
        "none let in: right": "0/1",
        "none let in: reward": "0.1000",
        "none let in: advantage": "-0.5000",
    }
    assert [second[k] for k in ("steps", "consulted", "consulted: right", "did not: right")] == [
        "5-8",
        "0",
        "0/0",
        "0/1",
    ]
    assert second["consulted: reward"] == second["answer let in: advantage"] == "-"
    header, [row] = script.why_table(tmp_path, ["0", "1"], by=script.family)
    by_family = dict(zip(header, row, strict=True))
    assert [by_family[k] for k in ("family", "episodes", "consulted", "did not: right")] == [
        "add1",
        "5",
        "3",
        "1/2",
    ]


def test_a_seed_without_its_rollouts_is_a_user_error(tmp_path: Path) -> None:
    from collabrl.errors import UserError

    (tmp_path / "eapo-seed0").mkdir()
    with pytest.raises(UserError, match="rollouts.jsonl is missing"):
        load_script("eapo_seeds").why_table(tmp_path, ["0"])
