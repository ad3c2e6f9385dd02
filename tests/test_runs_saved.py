"""What a run folder's config.yaml says (issue 34): the keys its run reads, not the other
protocols' sections, under a header of YAML comments saying how it ran (command line,
date, versions, git commit); the file stays a `--config` file, and folders saved whole
before keep resuming."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from collabrl import runs
from collabrl.config import build_config, option, read_yaml, save_config
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.runner import prepare_run_folder
from collabrl.protocols import registry
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.saved import unread_protocol_keys
from collabrl.protocols.spec import ProtocolSpec


def saved(folder: Path) -> dict:
    return yaml.safe_load((folder / runs.CONFIG).read_text())


def header(folder: Path) -> dict[str, str]:
    """The header's `# name: value` lines, by name."""
    lines = (folder / runs.CONFIG).read_text().splitlines()
    comments = [line.removeprefix("# ") for line in lines if line.startswith("#")]
    return dict(line.partition(": ")[::2] for line in comments)


# --- only the running protocol's section -----------------------------------------------------


def declared(spec: ProtocolSpec) -> set[str]:
    """The protocol keys a spec names as its own: its section and its collaborators'."""
    return {key for key in (spec.section, *(c.key for c in spec.collaborators)) if key}


def test_an_eval_solo_run_saves_no_other_protocols_keys(tmp_path: Path) -> None:
    config = EvalConfig(out=str(tmp_path))

    prepare_run_folder(config)

    protocol = saved(tmp_path)["protocol"]
    assert protocol["name"] == "solo"
    others = set().union(*map(declared, registry.specs()))
    assert others and not others & set(protocol)  # no teacher, no relay section, ...
    assert "options" not in protocol
    # What it left out loads back as the defaults the run had: a --config file as it stands.
    assert build_config(EvalConfig, [read_yaml(tmp_path / runs.CONFIG)]) == config


@pytest.mark.parametrize("spec", registry.specs(), ids=lambda spec: spec.name)
def test_every_protocol_keeps_its_own_keys_and_drops_the_others(spec: ProtocolSpec) -> None:
    unread = unread_protocol_keys(ProtocolConfig(name=spec.name))
    own = declared(spec)
    others = set().union(*map(declared, registry.specs())) - own
    assert unread >= {f"protocol.{key}" for key in others}
    assert not unread & {f"protocol.{key}" for key in own}


@dataclass
class MarkOptions:
    mark: str = option("!", "What the plugin appends.")


@pytest.fixture
def plugin() -> Iterator[ProtocolSpec]:
    """A protocol registered in code with an options class, for one test."""
    spec = ProtocolSpec(name="marked", help="test", build=lambda context: None, options=MarkOptions)
    registry.register(spec)
    try:
        yield spec
    finally:
        registry.unregister(spec.name)


def test_a_plugin_protocol_with_options_keeps_protocol_options(plugin, tmp_path: Path) -> None:
    config = EvalConfig(out=str(tmp_path), protocol=ProtocolConfig(name=plugin.name))
    config.protocol.options = {"mark": "?"}

    prepare_run_folder(config)

    protocol = saved(tmp_path)["protocol"]
    assert protocol["options"] == {"mark": "?"}
    assert not set().union(*map(declared, registry.specs())) & set(protocol)


# --- the header -----------------------------------------------------------------------------


def test_the_header_says_how_the_run_ran_in_yaml_comments(tmp_path, monkeypatch) -> None:
    # An argument with a newline, a line separator and an escape must not end the comment
    # (or be refused by the YAML reader): each is written escaped.
    argv = ["collab", "eval", "arith", "--set", "prompt=a\nb: 1\u2028c\x1b"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(tmp_path)  # not a git repository: no commit line
    out = tmp_path / "run"
    config = EvalConfig(out=str(out))

    prepare_run_folder(config)

    text = (out / runs.CONFIG).read_text()
    fields = header(out)
    assert fields["command"] == "collab eval arith --set 'prompt=a\\nb: 1\\u2028c\\x1b'"
    assert datetime.fromisoformat(fields["date"]).utcoffset().total_seconds() == 0
    versions = dict(v.split(" ") for v in fields["versions"].split(", "))
    assert list(versions) == ["collabrl", "torch", "transformers", "trl"]
    assert "git commit" not in fields
    assert text.startswith("# ") and len(fields) == 4  # one line each, all comments
    assert build_config(EvalConfig, [read_yaml(out / runs.CONFIG)]) == config


def test_a_package_that_is_not_installed_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runs, "RECORDED_PACKAGES", ("collabrl", "no-such-package-x"))
    prepare_run_folder(EvalConfig(out=str(tmp_path)))
    assert "no-such-package-x not installed" in header(tmp_path)["versions"]


def git(where: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, cwd=where, check=True, capture_output=True, text=True).stdout


def test_the_git_commit_of_the_working_directory_and_whether_it_is_dirty(
    tmp_path, monkeypatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text("x = 1\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-q", "-m", "first")
    head = git(repo, "rev-parse", "HEAD").strip()
    monkeypatch.chdir(repo)

    prepare_run_folder(EvalConfig(out=str(repo / "runs" / "a")))  # untracked: still clean
    assert header(repo / "runs" / "a")["git commit"] == head

    (repo / "train.py").write_text("x = 2\n")
    prepare_run_folder(EvalConfig(out=str(repo / "runs" / "b")))
    assert header(repo / "runs" / "b")["git commit"] == f"{head}+dirty"


def hostile_repository(where: Path, marker: Path) -> str:
    """A git repository whose own config names programs for git to run as it reads the
    working tree, each appending its name to `marker`: an fsmonitor hook, a filter
    driver's clean, smudge and long-running process commands (picked by .gitattributes)
    and a hooks folder. Its tracked file is then changed at the same size, so a status
    must read its content, through the filter. Gives the commit."""
    where.mkdir()
    git(where, "init", "-q")
    (where / "data.txt").write_text("one\n")
    (where / ".gitattributes").write_text("*.txt filter=evil\n")
    git(where, "add", "data.txt", ".gitattributes")
    git(where, "commit", "-q", "-m", "first")
    head = git(where, "rev-parse", "HEAD").strip()
    programs = where / "programs"
    programs.mkdir()
    for name in ("fsmonitor", "clean", "smudge", "process", "post-index-change"):
        script = programs / name
        script.write_text(f"#!/bin/sh\necho {name} >> '{marker}'\ncat\n")
        script.chmod(0o755)
    for key, value in {
        "core.fsmonitor": "fsmonitor",
        "filter.evil.clean": "clean",
        "filter.evil.smudge": "smudge",
        "filter.evil.process": "process",
        "filter.evil.required": None,
        "core.hooksPath": "",
    }.items():
        git(where, "config", key, "true" if value is None else str(programs / value))
    (where / "data.txt").write_text("two\n")  # same size: only the content tells
    return head


def test_a_repositorys_config_runs_no_program_when_the_commit_is_recorded(
    tmp_path, monkeypatch
) -> None:
    marker = tmp_path / "ran"
    head = hostile_repository(tmp_path / "repo", marker)
    monkeypatch.chdir(tmp_path / "repo")

    commit = runs.git_commit()
    prepare_run_folder(EvalConfig(out=str(tmp_path / "run")))

    assert not marker.exists(), marker.read_text()
    assert commit == f"{head}+dirty"
    assert header(tmp_path / "run")["git commit"] == f"{head}+dirty"


def test_a_filter_driver_that_cannot_be_switched_off_costs_the_commit_line(
    tmp_path, monkeypatch
) -> None:
    marker = tmp_path / "ran"
    hostile_repository(tmp_path / "repo", marker)
    programs = tmp_path / "repo" / "programs"
    git(tmp_path / "repo", "config", "filter.a=b.clean", str(programs / "clean"))
    (tmp_path / "repo" / ".gitattributes").write_text("*.txt filter=a=b\n")
    monkeypatch.chdir(tmp_path / "repo")

    commit = runs.git_commit()

    assert not marker.exists(), marker.read_text()
    assert commit is None


def test_a_real_command_in_a_hostile_repository_runs_none_of_its_programs(tmp_path) -> None:
    """`collab filter` as a user runs it, in the hostile repository, with a secret on its
    command line: git runs nothing the repository names, and the header hides the key."""
    from tests.cli.test_cli import collab

    marker = tmp_path / "ran"
    head = hostile_repository(tmp_path / "repo", marker)
    args = ["filter", "--teacher", "reference", "--data", "arith", "--limit", "1", "--k", "1"]
    args += ["--max-tokens", "8", "--api-key", "sk-LEAK", "--out", "run"]

    result = collab(*args, cwd=tmp_path / "repo")

    assert result.returncode == 0, result.stderr
    assert not marker.exists(), marker.read_text()
    fields = header(tmp_path / "repo" / "run")
    assert fields["git commit"] == f"{head}+dirty"
    assert "sk-LEAK" not in fields["command"] and "--api-key '<redacted>'" in fields["command"]
    # The body keeps the key: config.yaml is the --config file a resumed run reads.
    assert saved(tmp_path / "repo" / "run")["engine"]["api_key"] == "sk-LEAK"


def test_the_command_header_hides_secrets(tmp_path, monkeypatch) -> None:
    argv = ["collab", "eval", "arith", "--model", "http://me:hunter2@host/v1?token=t0k"]
    argv += ["--api-key=sk-1", "--set", "engine.api_key=sk-2"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(tmp_path)
    prepare_run_folder(EvalConfig(out=str(tmp_path / "run")))

    command = header(tmp_path / "run")["command"]
    for secret in ("hunter2", "t0k", "sk-1", "sk-2"):
        assert secret not in command
    assert "http://me:<redacted>@host/v1?token=<redacted>" in command


def test_a_missing_or_slow_git_costs_the_commit_line_never_the_run(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(Path(__file__).parent)  # inside this repository, were git found
    with monkeypatch.context() as slow:
        slow.setattr(runs, "GIT_TIMEOUT_S", 1e-9)
        prepare_run_folder(EvalConfig(out=str(tmp_path / "slow")))
    assert "git commit" not in header(tmp_path / "slow")

    with monkeypatch.context() as no_git:
        no_git.setenv("PATH", str(tmp_path))  # no git on it
        prepare_run_folder(EvalConfig(out=str(tmp_path / "no-git")))
    assert "git commit" not in header(tmp_path / "no-git")

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # a working directory deleted under the run
    prepare_run_folder(EvalConfig(out=str(tmp_path / "gone-cwd")))
    assert "git commit" not in header(tmp_path / "gone-cwd")


# --- resuming: compare what the run reads ---------------------------------------------------


def test_an_old_folder_saved_whole_resumes_and_is_checked(tmp_path: Path) -> None:
    config = EvalConfig(out=str(tmp_path))
    # An old folder: every section saved, an unread one even set (nothing refused it).
    old = dataclasses.replace(config, protocol=ProtocolConfig())
    old.protocol.relay = dataclasses.replace(old.protocol.relay, max_calls=3)
    save_config(old, tmp_path / runs.CONFIG)
    (tmp_path / runs.SAMPLES).write_text('{"item_id": "a", "sample": 0}\n')

    prepare_run_folder(config)  # resumes: the relay section is not this run's
    assert "relay" not in saved(tmp_path)["protocol"]

    with pytest.raises(UserError, match="different benchmark"):
        prepare_run_folder(dataclasses.replace(config, benchmark="arith"))


def test_a_different_experiment_names_the_key_that_differs_not_its_section(tmp_path) -> None:
    config = EvalConfig(out=str(tmp_path), protocol=ProtocolConfig(name="relay", teacher="t"))
    prepare_run_folder(config)
    (tmp_path / runs.SAMPLES).write_text('{"item_id": "a", "sample": 0}\n')
    before = config.protocol.relay.max_calls
    config.protocol.relay = dataclasses.replace(config.protocol.relay, max_calls=before + 1)

    with pytest.raises(UserError) as refused:
        prepare_run_folder(config)

    expected = f"different protocol.relay.max_calls ({before} there, {before + 1} now)"
    assert expected in str(refused.value)


def test_an_evolve_run_saves_its_protocols_keys_only(tiny_model_dir, tmp_path: Path) -> None:
    from collabrl.evolve import EvolveConfig, run_evolve

    data = tmp_path / "one.jsonl"
    data.write_text('{"id": "q", "problem": "Compute 1 + 1.", "answer": "2"}\n')
    layer = {
        "benchmark": str(data),
        "models": [str(tiny_model_dir)],
        "rounds": 1,
        "out": str(tmp_path / "run"),
        "review_max_tokens": 2,
        "sampling": {"n": 1, "max_tokens": 2},
        "protocol": {"name": "solo"},  # evolve's default is apollo: its section goes too
    }

    run_evolve(build_config(EvolveConfig, [layer]))

    protocol = saved(tmp_path / "run")["protocol"]
    assert protocol["name"] == "solo"
    assert not set().union(*map(declared, registry.specs())) & set(protocol)
    assert "command" in header(tmp_path / "run")
