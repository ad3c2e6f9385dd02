"""lm-eval's `local-completions` client, with its default arguments, against a real
`collab serve` (the embedded server): a generation task and a multiple-choice task.

The client's defaults send token ids (`tokenized_requests`), find the server's tokenizer
through /tokenizer_info and /tokenize, and score each choice with `echo` + `logprobs` +
`max_tokens: 1`. The tasks read local JSON files (the hub is not reachable here); the
answers are checked against the model run in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ServerProcess

GENERATION = [
    {"question": "Q: 1 + 1 =", "answer": "2"},
    {"question": "Q: The sky is", "answer": "blue"},
    {"question": "Q: Paris is in", "answer": "France"},
]
CHOICES = [
    {"question": "The colour of grass is", "choices": ["green", "red", "blue"], "label": 0},
    {"question": "Two plus two is", "choices": ["four", "five"], "label": 0},
]
MAX_GEN_TOKS = 8
TASKS = {
    "tiny_gen": (
        GENERATION,
        {
            "output_type": "generate_until",
            "doc_to_text": "{{question}}",
            "doc_to_target": "{{answer}}",
            "generation_kwargs": {"until": ["\n"], "max_gen_toks": MAX_GEN_TOKS},
            "metric_list": [{"metric": "exact_match"}],
        },
    ),
    "tiny_mc": (
        CHOICES,
        {
            "output_type": "multiple_choice",
            "doc_to_text": "{{question}}",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "{{label}}",
            "metric_list": [{"metric": "acc"}],
        },
    ),
}


def _lm_eval() -> str | None:
    """lm-eval's command: $LM_EVAL, on the PATH, or beside this Python (a venv's)."""
    beside = Path(sys.executable).with_name("lm_eval")
    return (
        os.environ.get("LM_EVAL")
        or shutil.which("lm_eval")
        or (str(beside) if beside.exists() else None)
    )


def _write_tasks(folder: Path) -> None:
    """The tasks as lm-eval YAML (JSON is YAML) over local JSON-lines files."""
    folder.mkdir()
    for name, (docs, fields) in TASKS.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        task = {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test",
            **fields,
        }
        (folder / f"{name}.yaml").write_text(json.dumps(task))


def _samples(out: Path, task: str) -> list[dict]:
    [path] = out.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_lm_eval_local_completions_runs_generation_and_multiple_choice(
    tiny_model_dir, tiny_engine, tmp_path
):
    lm_eval = _lm_eval()
    if lm_eval is None:
        pytest.skip("lm-eval is not installed (pip install 'lm-eval[api]'; or set $LM_EVAL)")
    _write_tasks(tmp_path / "tasks")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
    }
    with ServerProcess(tiny_model_dir) as server:
        result = subprocess.run(
            [
                lm_eval,
                "--model",
                "local-completions",
                "--model_args",
                f"model=expert,base_url={server.url}/completions",
                "--include_path",
                str(tmp_path / "tasks"),
                "--tasks",
                ",".join(TASKS),
                "--output_path",
                str(tmp_path / "out"),
                "--log_samples",
            ],  # fmt: skip
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        log = "".join(server.lines)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Using remote tokenizer" in result.stderr  # found through /tokenizer_info
    assert '"POST /v1/completions HTTP/1.1" 400' not in log, log
    [results] = (tmp_path / "out").rglob("results_*.json")
    scores = json.loads(results.read_text())["results"]
    assert "exact_match,none" in scores["tiny_gen"] and "acc,none" in scores["tiny_mc"]
    _check_generations(_samples(tmp_path / "out", "tiny_gen"), tiny_engine)
    _check_loglikelihoods(_samples(tmp_path / "out", "tiny_mc"), tiny_engine)


def _check_generations(samples: list[dict], engine) -> None:
    """What lm-eval got over HTTP is the greedy text of the model run here."""
    from collabrl.engines.base import SamplingParams

    params = SamplingParams(max_tokens=MAX_GEN_TOKS, stop=("\n",))
    prompts = [GENERATION[s["doc_id"]]["question"] for s in samples]
    here = [group[0].text for group in engine.generate(prompts, params)]
    assert [s["resps"][0][0] for s in samples] == here


def _check_loglikelihoods(samples: list[dict], engine) -> None:
    """Each choice's log-likelihood is the one a single forward pass gives here: the
    continuation's tokens after the context's, as lm-eval splits them."""
    import torch

    tokenizer, model = engine.tokenizer, engine.model
    for sample in samples:
        doc = CHOICES[sample["doc_id"]]
        for choice, [[loglik, _]] in zip(doc["choices"], sample["resps"], strict=True):
            context = tokenizer(doc["question"], add_special_tokens=False)["input_ids"]
            whole = tokenizer(f"{doc['question']} {choice}", add_special_tokens=False)["input_ids"]
            with torch.inference_mode():
                logits = model(torch.tensor([whole])).logits[0].float()
            logprobs = torch.log_softmax(logits, -1)
            expected = sum(
                logprobs[i - 1, whole[i]].item() for i in range(len(context), len(whole))
            )
            assert float(loglik) == pytest.approx(expected, abs=1e-3)
