"""`collab eval` with collaborative protocols: metrics, and an expert server killed mid-run."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from collabrl import runs
from collabrl.config import build_config
from collabrl.episode import Episode
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.runner import run_eval
from tests.cli.test_bad_input_jobs import Garbage
from tests.protocols.scripted import ScriptedEngine
from tests.servers import ServerProcess

CALL = (
    '<think>ask</think><agent_calls>[{"expert_id": 1, "input_parameters": {"query": "2+2?"}}]'
    "</agent_calls>"
)


def _config(
    model: str, out: Path, protocol: dict, limit: int = 2, batch: int = 2, max_tokens: int = 120
) -> EvalConfig:
    layer = {
        "benchmark": "gsm8k",
        "model": model,
        "limit": limit,
        "out": str(out),
        "protocol": protocol,
        "sampling": {"n": 1, "max_tokens": max_tokens, "seed": 0},
        "engine": {"batch_size": batch},
    }
    return build_config(EvalConfig, [layer])


def _episodes(out: Path) -> list[Episode]:
    lines = (out / runs.SAMPLES).read_text().splitlines()
    return [Episode.from_dict(json.loads(line)["episode"]) for line in lines]


def test_relay_eval_counts_calls_and_both_call_ratios(smol_tokenizer, tiny_model_dir, tmp_path):
    def student(prompt) -> str:
        return (
            "Let me see. <call>6</call>" if "<call>" not in smol_tokenizer.decode(prompt) else " 18"
        )

    out = tmp_path / "relay"
    tiny = str(tiny_model_dir)
    config = _config(tiny, out, {"name": "relay", "teacher": tiny})
    result = run_eval(config, engine=ScriptedEngine(smol_tokenizer, student))

    m = result.metrics
    assert m["calls_per_sample"] == 1.0 and m["call_failures"] == 0
    episodes = _episodes(out)
    helper = sum(len(e.calls[0].token_ids) for e in episodes)
    total = sum(len(e.response_ids) for e in episodes)
    assert m["call_ratio"] == helper / total
    assert 0 < m["call_ratio"] <= m["call_ratio_requested"]  # a tiny teacher may stop early
    assert all(e.calls[0].meta["requested_tokens"] == 6 for e in episodes)


def test_expert_server_killed_during_a_consult_eval(smol_tokenizer, tiny_model_dir, tmp_path):
    """The eval finishes; calls after the kill are failures in metrics.json."""

    def policy(prompt) -> str:
        reply = smol_tokenizer.decode(prompt).split("<|im_start|>assistant")[-1]
        return CALL if "<agent_returns>" not in reply else "Answer: 4"

    out = tmp_path / "consult"
    with ServerProcess(tiny_model_dir) as server:
        server.wait_ready()
        protocol = {
            "name": "consult",
            "experts": [server.url],
            "consult": {"expert_max_tokens": 8},
        }
        config = _config(str(tiny_model_dir), out, protocol, limit=6, batch=2)
        # Chunks of one batch (two episodes), so the expert dies between chunks.
        config.engine.continuous_batching = False

        def progress(done: int, total: int) -> None:
            if done == 2:  # the first chunk of two episodes is finished: kill the expert
                server.kill()

        result = run_eval(config, engine=ScriptedEngine(smol_tokenizer, policy), progress=progress)

    saved = json.loads((out / runs.METRICS).read_text())
    assert saved == result.metrics and saved["problems"] == 6
    assert saved["calls_per_sample"] == 1.0
    assert saved["call_failures"] == 4  # the four episodes after the kill
    episodes = _episodes(out)
    outcomes = [e.calls[0].meta["outcome"] for e in episodes]
    assert outcomes == ["ok", "ok"] + ["unavailable"] * 4
    assert all(e.answer == "4" for e in episodes)  # every episode still finished


def test_reference_teachers_and_experts_answer_each_item_and_are_labelled(
    smol_tokenizer, tmp_path
) -> None:
    """Each task carries its own item's reference; metrics.json says the helper is a stand-in."""
    relay = _config("scripted", tmp_path / "relay", {"name": "relay", "teacher": "reference"})
    policy = ScriptedEngine(smol_tokenizer, lambda prompt: "Let me ask. <call>100</call>")
    result = run_eval(relay, engine=policy)
    assert result.metrics["pass@1"] == 1.0 and "gold answer" in result.metrics["stand_in"]
    lines = [json.loads(line) for line in (tmp_path / "relay" / runs.SAMPLES).open()]
    for line in lines:
        [call] = Episode.from_dict(line["episode"]).calls
        assert line["end"] == "teacher_eos" and f"\\boxed{{{line['gold']}}}" in call.text
        assert call.meta["endpoint"] == "reference (stand-in)"

    protocol = {"name": "consult", "experts": ["reference"]}
    # The expert's reply is GSM8K's whole worked solution: room for it in the budget.
    consult = _config("scripted", tmp_path / "consult", protocol, limit=1, max_tokens=400)
    replies = [CALL, "Answer: 18"]
    result = run_eval(consult, engine=ScriptedEngine(smol_tokenizer, replies))
    [episode] = _episodes(tmp_path / "consult")
    assert episode.calls[0].meta["outcome"] == "ok" and "boxed{18}" in episode.calls[0].text
    assert "stand_in" in result.metrics


def test_a_collaborator_the_protocol_never_calls_is_refused(smol_tokenizer, tmp_path) -> None:
    config = _config("scripted", tmp_path / "solo", {"name": "solo", "teacher": "reference"})
    with pytest.raises(UserError, match="protocol.teacher is set, but the solo protocol has no"):
        run_eval(config, engine=ScriptedEngine(smol_tokenizer, lambda prompt: "18"))
    assert not (tmp_path / "solo").exists()


def test_eval_grades_each_problem_as_its_answer_type(smol_tokenizer, tmp_path) -> None:
    """The same echoed expression is right on a `math` row and wrong on a `number` row."""
    rows = [
        {"id": "n", "problem": "What is 36 × 15?", "answer": "540", "answer_type": "number"},
        {"id": "m", "problem": "What is 36 × 15?", "answer": "540"},
    ]
    data = tmp_path / "echo.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = _config("scripted", tmp_path / "run", {"name": "solo"})
    config.benchmark = str(data)
    echo = ScriptedEngine(smol_tokenizer, lambda prompt: "It is \\boxed{36 \\times 15}.")
    result = run_eval(config, engine=echo)
    samples = [
        json.loads(line) for line in (tmp_path / "run" / runs.SAMPLES).read_text().splitlines()
    ]
    assert {s["item_id"]: s["correct"] for s in samples} == {"n": False, "m": True}
    assert result.metrics["pass@1"] == 0.5


def test_the_judge_is_not_asked_about_number_problems(smol_tokenizer, tmp_path) -> None:
    """A `number` row's rule is the whole answer: the judge (here one that lists its
    models, as the run's probe asks, but answers garbage, so that asking it would fail)
    is never asked to overturn it."""
    row = {"id": "n", "problem": "What is 36 × 15?", "answer": "540", "answer_type": "number"}
    data = tmp_path / "echo.jsonl"
    data.write_text(json.dumps(row) + "\n")
    config = _config("scripted", tmp_path / "run", {"name": "solo"})
    echo = ScriptedEngine(smol_tokenizer, lambda prompt: "It is \\boxed{36 \\times 15}.")
    judge = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=judge.serve_forever, daemon=True).start()
    try:
        config.benchmark = str(data)
        config.judge = f"http://127.0.0.1:{judge.server_address[1]}/bytes/v1"
        result = run_eval(config, engine=echo)
    finally:
        judge.shutdown()
        judge.server_close()
    assert result.metrics["pass@1"] == 0.0
    assert not (tmp_path / "run" / "judge.jsonl").exists()
