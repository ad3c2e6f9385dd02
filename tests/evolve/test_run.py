"""`collab evolve` end to end with real models: two `collab serve` endpoints, resume,
and a run whose gold answers must never reach a prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from collabrl.config import build_config
from collabrl.data.benchmarks import load_benchmark
from collabrl.errors import UserError
from collabrl.evolve import EvolveConfig, run_evolve
from collabrl.evolve.prompts import rank
from collabrl.evolve.select import SELECTORS
from collabrl.evolve.state import Candidate
from tests.servers import ServerProcess


@pytest.fixture(scope="module")
def two_endpoints() -> Iterator[tuple[str, str]]:
    """Two servers of SmolLM2-135M, started together: a random tiny model never writes
    an answer, and only answers are reviewed."""
    servers = [ServerProcess("smollm2-135m", role="policy") for _ in range(2)]
    try:
        for server in servers:
            server.wait_ready()
        yield servers[0].url, servers[1].url
    finally:
        for server in servers:
            server.kill()


def _evolve(app: typer.Typer, *args: str) -> str:
    result = CliRunner().invoke(app, ["evolve", *args], env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


def _round(out: Path, round_no: int) -> list[Candidate]:
    lines = (out / f"round-{round_no}.jsonl").read_text().splitlines()
    return [Candidate.from_dict(json.loads(line)) for line in lines]


@pytest.mark.slow
def test_two_endpoints_two_rounds_with_resume(cli, two_endpoints, tmp_path: Path) -> None:
    a, b = two_endpoints
    out = tmp_path / "run"
    common = ["arith", "--model", a, "--model", b, "--limit", "2", "--branches", "2"]
    common += ["--max-tokens", "48", "--out", str(out), "--set", "review_max_tokens=24"]
    common += ["--protocol", "solo"]  # the tool-free path; apollo runs in process below
    printed = _evolve(cli, *common, "--rounds", "1")
    assert "1 new rounds" in printed and "selected (score)" in printed
    first = (out / "round-1.jsonl").read_bytes()

    printed = _evolve(cli, *common, "--rounds", "2", "--resume")
    assert "1 new rounds" in printed
    assert (out / "round-1.jsonl").read_bytes() == first  # round 1 was not redone
    state = json.loads((out / "state.json").read_text())
    assert [r["round"] for r in state["rounds"]] == [1, 2]
    assert (out / "curve.png").stat().st_size > 1000

    round1, round2 = _round(out, 1), _round(out, 2)
    problems = {item.id: item.problem for item in load_benchmark("arith", limit=2).items}
    assert len(round1) == len(round2) == 2 * 2 * 2  # problems × models × branches
    assert sum(bool(c.reviews) for c in round1 + round2) >= 4
    for c in round1:  # each branch has its own seed, so its own candidate
        [twin] = [
            t for t in round1 if (t.problem_id, t.model) == (c.problem_id, c.model) and t != c
        ]
        assert twin.branch != c.branch and twin.completion != c.completion
    for c in round1 + round2:
        expected = [] if c.answer is None else [b if c.model == 0 else a]
        assert [r.reviewer for r in c.reviews] == expected  # the other endpoint reviewed
    # Round 2's question is the problem plus the best round-1 candidate of that problem.
    for c in round2:
        question = c.episode["meta"]["question"]
        best = rank([p for p in round1 if p.problem_id == c.problem_id])[0]
        entry = f"Attempt 1 (round 1, model {best.model + 1}): answer {best.answer or 'none'}"
        assert question.startswith(problems[c.problem_id] + "\n\nEarlier attempts")
        assert entry in question and best.completion.strip()[:10] in question
    for c in round1:
        assert "Attempt" not in c.episode["meta"]["question"]
    # The summaries are what the candidates on disk give.
    for summary, pool in ((state["rounds"][0], round1), (state["rounds"][1], round1 + round2)):
        new = _round(out, summary["round"])
        assert summary["candidate_accuracy"] == sum(c.correct for c in new) / len(new)
        for problem_id, picked in summary["selected"].items():
            mine = [c for c in pool if c.problem_id == problem_id]
            assert picked == {rule: pick(mine) for rule, pick in SELECTORS.items()}

    printed = _evolve(cli, *common, "--rounds", "2", "--resume")
    assert "0 new rounds" in printed
    with pytest.raises(UserError, match="already holds an evolve run"):
        _evolve(cli, *common, "--rounds", "2")
    fewer = [*common]
    fewer[fewer.index("--branches") + 1] = "1"
    with pytest.raises(UserError, match="different sampling"):
        _evolve(cli, *fewer, "--resume")


def test_gold_answers_never_reach_a_prompt_or_the_state(tiny_model_dir, tmp_path: Path) -> None:
    gold = "918273645"
    data = tmp_path / "sentinel.jsonl"
    rows = [{"id": f"q{i}", "problem": f"Compute {i} + {i}.", "answer": gold} for i in range(2)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tiny = str(tiny_model_dir)
    layer = {
        "benchmark": str(data),
        "models": [tiny, tiny],
        "rounds": 2,
        "out": str(tmp_path / "run"),
        "review_max_tokens": 8,
        "sampling": {"n": 1, "max_tokens": 12},
    }
    result = run_evolve(build_config(EvolveConfig, [layer]))
    assert result.new_rounds == 2 and len(result.rounds) == 2
    for path in result.out_dir.iterdir():
        if path.suffix in (".json", ".jsonl"):
            assert gold not in path.read_text(), path
    round2 = _round(result.out_dir, 2)
    assert all("Earlier attempts" in c.episode["meta"]["question"] for c in round2)
    assert result.rounds[1]["candidate_accuracy"] == 0.0


def test_refusals_come_before_any_model_loads(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="at least one model"):
        run_evolve(EvolveConfig(out=str(tmp_path / "x")))
    with pytest.raises(UserError, match="select must be score or vote"):
        run_evolve(EvolveConfig(models=["smollm2-135m"], select="best"))
    reference = build_config(
        EvolveConfig,
        [{"models": ["m"], "protocol": {"name": "relay", "teacher": "reference"}}],
    )
    with pytest.raises(UserError, match="gold answers"):
        run_evolve(reference)
    with pytest.raises(UserError, match="gold answers"):
        run_evolve(EvolveConfig(models=["smollm2-135m", "reference"], out=str(tmp_path / "x")))
    assert not (tmp_path / "x").exists()
