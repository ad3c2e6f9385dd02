"""`--revision` and `collab models` against a Hugging Face cache laid out as huggingface_hub
writes it, offline (HF_HUB_OFFLINE=1, HF_HOME in a temporary folder): the revision reaches
every command that loads a model, and a run saves the commit it loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from collabrl.cli.main import app
from collabrl.cli.options import REVISION_KEYS
from tests.cli.test_cli import assert_one_line_error, collab
from tests.conftest import write_tiny_llama
from tests.test_models_hub_cache import REPO, fake_hub_cache


@pytest.fixture
def hf_home(
    tmp_path: Path, tiny_model_dir: Path, smol_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """An HF_HOME whose cache holds REPO at `main` (the tiny model) and at tag `v2` (another
    tiny model, wider); the environment of a `collab` run that reads it offline. The
    snapshots' commits are in the returned mapping too (`main`, `v2`)."""
    hub = tmp_path / "hf" / "hub"
    main = fake_hub_cache(hub, REPO, tiny_model_dir)
    other = write_tiny_llama(smol_tokenizer, tmp_path / "other", hidden_size=32)
    v2 = fake_hub_cache(hub, REPO, other, ref="v2")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    return {**env, "main": main.name, "v2": v2.name}


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def _saved(folder: Path, key: str) -> str:
    return yaml.safe_load((folder / "config.yaml").read_text())[key]


def test_eval_runs_a_hub_model_at_a_commit_from_the_cache(
    hf_home: dict[str, str], tmp_path: Path
) -> None:
    """The issue's example, through the real `collab` script."""
    commit = hf_home["v2"]
    args = ["eval", "run", "arith", "--model", REPO, "--revision", commit]
    result = collab(*args, "--limit", "2", "--max-tokens", "4", "--out", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _saved(tmp_path / "run", "model") == f"{REPO}@{commit}"
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["model_sha"] == commit and results["model"] == f"{REPO}@{commit}"


@pytest.mark.parametrize(
    ("given", "loaded"), [((), "main"), (("--revision", "v2"), "v2")], ids=["main", "tag"]
)
def test_a_run_saves_the_commit_a_branch_or_tag_named(
    given: tuple[str, ...], loaded: str, hf_home: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", "arith", "--model", REPO, *given, "--limit", "1", "--max-tokens", "2"]
    result = _invoke(*args, "--out", "run")
    assert result.exit_code == 0, result.output
    assert _saved(tmp_path / "run", "model") == f"{REPO}@{hf_home[loaded]}"
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["model_sha"] == hf_home[loaded]


def test_a_local_model_has_no_commit_in_results(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ["eval", "run", "arith", "--model", str(tiny_model_dir), "--limit", "1"]
    result = _invoke(*args, "--max-tokens", "2", "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "results.json").read_text())["model_sha"] is None
    assert _saved(tmp_path / "run", "model") == str(tiny_model_dir)  # as given


def test_the_train_dry_run_plans_the_revision(hf_home: dict[str, str]) -> None:
    args = ["train", "grpo", "--dry-run", "--model", REPO, "--data", "arith_train"]
    result = _invoke(*args, "--revision", "v2")
    assert result.exit_code == 0, result.output
    assert f"{REPO}@{hf_home['v2']}" in result.output
    assert "not on this machine" not in result.output


def test_serve_serves_the_snapshot_of_the_revision(hf_home: dict[str, str]) -> None:
    args = ["serve", "expert", "--engine", "vllm", "--dry-run", "--model", REPO]
    result = _invoke(*args, "--revision", "v2")
    assert result.exit_code == 0, result.output
    assert f"snapshots/{hf_home['v2']} " in result.output


def test_filter_applies_the_revision_to_its_teacher(
    hf_home: dict[str, str], tmp_path: Path
) -> None:
    args = ["filter", "--teacher", REPO, "--revision", "v2", "--data", "arith", "--limit", "1"]
    result = _invoke(*args, "--k", "1", "--max-tokens", "2", "--out", "run")
    assert result.exit_code == 0, result.output
    assert _saved(tmp_path / "run", "teacher") == f"{REPO}@{hf_home['v2']}"


# Each command that loads a model, with what it needs before its config resolves.
COMMANDS = {
    "eval": ["eval", "run", "arith"],
    "infer": ["infer", "solo", "1+1?"],
    "serve": ["serve", "expert"],
    "build-warmup-relay": ["build-warmup", "relay"],
    "build-warmup-rsim": ["build-warmup", "rsim"],
    "build-warmup-consult": ["build-warmup", "consult"],
    "build-warmup-apollo": ["build-warmup", "apollo"],
    "filter": ["filter", "--teacher", "smollm2-135m"],
    "train-sft": ["train", "sft"],
    **{f"train-{m}": ["train", m] for m in ("grpo", "relay", "eapo", "rsim")},
}


def test_every_command_that_loads_a_model_is_listed() -> None:
    assert set(COMMANDS) == set(REVISION_KEYS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_a_revision_and_refuses_it_for_an_embedded_model(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = _invoke(*COMMANDS[command], "--revision", "v2")
    assert result.exit_code != 0
    assert "--revision v2: 'smollm2-135m' is not a hub name" in str(result.exception)
    assert list(tmp_path.iterdir()) == []  # refused before any folder was written


def test_a_revision_the_cache_lacks_is_one_line_naming_those_it_has(
    hf_home: dict[str, str], tmp_path: Path
) -> None:
    args = ["eval", "run", "arith", "--model", REPO, "--revision", "v3", "--out", "run"]
    result = collab(*args, cwd=tmp_path)
    assert_one_line_error(
        result, f"holds {REPO}, but not its revision 'v3'", f"v2 = {hf_home['v2']}"
    )
    assert not (tmp_path / "run").exists()


def test_collab_models_lists_the_cache(hf_home: dict[str, str]) -> None:
    result = _invoke("models")
    assert result.exit_code == 0, result.output
    assert "smollm2-135m" in result.output  # the embedded models still come first
    assert f"Hugging Face cache {Path(hf_home['HF_HOME']) / 'hub'}" in result.output
    assert REPO in result.output
    assert f"main = {hf_home['main']}" in result.output
    assert f"v2 = {hf_home['v2']}" in result.output
    assert " MB " in result.output  # the tiny models' size


def test_collab_models_with_an_empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    result = _invoke("models")
    assert result.exit_code == 0, result.output
    where = f"Hugging Face cache {tmp_path / 'hub'} (HF_HUB_CACHE, else HF_HOME/hub)"
    assert f"{where}: no models" in result.output


@pytest.mark.parametrize(("revision", "loaded"), [(None, "main"), ("v2", "v2")])
def test_the_python_api_pins_the_commit_as_the_cli_does(
    revision: str | None, loaded: str, hf_home: dict[str, str], tmp_path: Path
) -> None:
    import collabrl

    results = collabrl.evaluate(
        "arith", REPO, revision=revision, limit=1, max_tokens=2, out=tmp_path / "api"
    )
    assert results["model_sha"] == hf_home[loaded]
    assert _saved(tmp_path / "api", "model") == f"{REPO}@{hf_home[loaded]}"


def test_a_teacher_and_experts_are_pinned_as_the_policy_is(
    hf_home: dict[str, str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A collaborator's hub name reaches config.yaml at the commit it loaded, from the CLI
    and the Python API alike; a stand-in and a local path stay as given."""
    import collabrl

    pinned = f"{REPO}@{hf_home['main']}"
    args = ["eval", "run", "arith", "--model", str(tiny_model_dir), "--protocol", "relay"]
    result = _invoke(*args, "--teacher", REPO, "--limit", "1", "--max-tokens", "2", "--out", "r")
    assert result.exit_code == 0, result.output
    assert _saved(tmp_path / "r", "protocol")["teacher"] == pinned
    experts = {"protocol": {"experts": [REPO, "reference@0.7"], "consult": {"num_experts": 2}}}
    collabrl.evaluate(
        "arith",
        str(tiny_model_dir),
        protocol="consult",
        limit=1,
        max_tokens=2,
        out=tmp_path / "api",
        overrides=experts,
    )
    assert _saved(tmp_path / "api", "protocol")["experts"] == [pinned, "reference@0.7"]
    assert _saved(tmp_path / "api", "model") == str(tiny_model_dir)


def test_evolve_pins_each_model_it_loads(hf_home: dict[str, str], tmp_path: Path) -> None:
    args = ["evolve", "arith", "--model", REPO, "--model", f"{REPO}@v2", "--protocol", "solo"]
    args += ["--limit", "1", "--rounds", "1", "--branches", "1", "--max-tokens", "2"]
    result = _invoke(*args, "--out", "run")
    assert result.exit_code == 0, result.output
    assert _saved(tmp_path / "run", "models") == [
        f"{REPO}@{hf_home['main']}",
        f"{REPO}@{hf_home['v2']}",
    ]
