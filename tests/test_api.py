"""The Python API (collabrl/api.py, docs/api.md): `collabrl.evaluate` returns what `collab
eval` writes, `collabrl.train` what `collab train` runs, each on the tiny random model;
bad input is a UserError before any work; `import collabrl` stays light.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import collabrl
from collabrl.errors import UserError
from collabrl.eval.results import RESULTS
from collabrl.train.run import METRICS
from tests.cli.test_cli import collab

# Different in every run by nature: when it ran, the path it was told to write, and the
# git commit of the folder it ran in (the CLI runs in a temporary folder, no repository).
PER_RUN = {"date", "out", "git_hash"}
# How fast it ran.
TIMINGS = {"tokens_per_second", "generation_seconds"}


def shape(doc: Any) -> Any:
    """The keys of a JSON document at every depth, with its values left out."""
    if isinstance(doc, dict):
        return {key: shape(value) for key, value in doc.items()}
    return type(doc).__name__


def without(doc: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """`doc` without `keys` at any depth."""
    return {
        k: without(v, keys) if isinstance(v, dict) else v for k, v in doc.items() if k not in keys
    }


def test_importing_collabrl_loads_no_heavy_library() -> None:
    code = (
        "import sys, collabrl, collabrl.plugin; collabrl.evaluate; collabrl.train\n"
        "heavy = {'torch', 'transformers', 'trl', 'openai', 'vllm'} & set(sys.modules)\n"
        "print(sorted(heavy))"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert shown.stdout.strip() == "[]", shown.stderr


def test_the_api_is_listed_and_an_unknown_name_is_an_attribute_error() -> None:
    assert {"evaluate", "train", "__version__"} <= set(dir(collabrl))
    with pytest.raises(AttributeError, match="no attribute 'evalute'"):
        collabrl.evalute  # noqa: B018


def test_evaluate_returns_the_results_json_the_cli_writes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = {"limit": 3, "n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 5}
    returned = collabrl.evaluate("arith", str(tiny_model_dir), out=tmp_path / "api", **settings)
    # The document returned is the one written, and the one the CLI writes for the same
    # settings: the same keys at every depth, the same scores.
    written = json.loads((tmp_path / "api" / RESULTS).read_text())
    assert returned == written
    args = ["--limit", "3", "--n", "2", "--max-tokens", "8", "--temperature", "1.0"]
    args += ["--seed", "5", "--model", str(tiny_model_dir), "--out", "cli"]
    result = collab("eval", "arith", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    by_cli = json.loads((tmp_path / "cli" / RESULTS).read_text())
    assert shape(without(returned, PER_RUN)) == shape(without(by_cli, PER_RUN))
    # The same samples, scored the same: one seed, one engine.
    assert without(returned["results"], TIMINGS) == without(by_cli["results"], TIMINGS)
    assert returned["configs"] == by_cli["configs"]


def test_evaluate_reads_a_config_and_overrides_by_dotted_key(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    file = tmp_path / "eval.yaml"
    file.write_text("sampling:\n  max_tokens: 4\n  n: 3\nlimit: 5\n")
    returned = collabrl.evaluate(
        "arith",
        str(tiny_model_dir),
        config=file,
        limit=2,  # a keyword over the file
        overrides={"sampling.n": 1},  # a dotted key over both
        out=tmp_path / "run",
    )
    assert returned["configs"]["arith"]["n"] == 1
    assert returned["configs"]["arith"]["limit"] == 2
    assert returned["configs"]["arith"]["sampling"]["max_tokens"] == 4


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"n": 0}, "sampling.n"),
        ({"overrides": {"sampling.bogus": 1}}, "bogus"),
        ({"protocol": "no-such-protocol"}, "no-such-protocol"),
        ({"config": "missing.yaml"}, "missing.yaml"),
    ],
)
def test_evaluate_refuses_bad_input_before_any_work(
    kwargs: dict[str, Any], fragment: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(UserError, match=fragment):
        collabrl.evaluate("arith", str(tiny_model_dir), out=tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()


def test_several_benchmarks_need_an_out_folder(tiny_model_dir: Path) -> None:
    with pytest.raises(UserError, match="2 benchmarks and no out folder"):
        collabrl.evaluate("arith,arith4", str(tiny_model_dir))


def test_evaluate_warns_as_the_cli_does(tiny_model_dir: Path, tmp_path: Path) -> None:
    # Greedy with several samples: the CLI's warning, then the unknown benchmark's error.
    with pytest.warns(UserWarning, match="greedy"), pytest.raises(UserError, match="gsm9k"):
        collabrl.evaluate("gsm9k", str(tiny_model_dir), n=2, temperature=0.0)


@pytest.mark.parametrize(
    ("args", "kwargs", "fragment"),
    [
        (("dpo",), {}, "unknown method 'dpo'"),
        (("relay",), {"config": {"method": "eapo"}}, "the config sets method eapo"),
        (("grpo",), {"steps": -1}, "steps"),
    ],
)
def test_train_refuses_bad_input_before_any_work(
    args: tuple[str, ...], kwargs: dict[str, Any], fragment: str, tmp_path: Path
) -> None:
    with pytest.raises(UserError, match=fragment):
        collabrl.train(*args, out=tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()


def test_train_runs_one_step_and_returns_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    result = collabrl.train(
        "grpo",
        str(tiny_model_dir),
        "arith_train",
        steps=1,
        prompts_per_step=2,
        num_generations=2,
        max_tokens=8,
        limit=4,
        out=tmp_path / "run",
        report=lines.append,
    )
    assert result.out_dir == tmp_path / "run" and result.steps == 1
    logged = [json.loads(line) for line in (tmp_path / "run" / METRICS).read_text().splitlines()]
    assert result.history == logged
    assert (result.out_dir / "final" / "config.json").is_file()
    assert any(line.startswith("step 1/1 · reward") for line in lines)
