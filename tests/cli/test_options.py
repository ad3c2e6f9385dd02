"""Config-bound options, value checks before any model loads, and `collab config show`.

In-process (typer's CliRunner): a refused run raises its UserError before a model is
loaded, so these are fast; test_cli.py checks through the real script that such errors
print as one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from collabrl.cli import options as opt
from collabrl.cli.main import app
from collabrl.config import (
    SamplingConfig,
    build_config,
    check_sections,
    describe_config,
    field_help,
    option,
)
from collabrl.episode import Author
from collabrl.errors import UserError
from collabrl.protocols import registry
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.spec import Collaborator, Flag, ProtocolSpec
from collabrl.train.methods import registry as methods

runner = CliRunner()
WIDE = {"COLUMNS": "400"}  # help and usage errors on unwrapped lines


def _refused(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The UserError message of a command that must be refused."""
    monkeypatch.chdir(cwd)
    result = runner.invoke(app, args)
    assert isinstance(result.exception, UserError), (result.exception, result.stdout)
    return str(result.exception)


# --- every config-bound option names a real key, and shows that key's help ----------------------


def _config_commands() -> list[tuple[str, typer.core.TyperCommand]]:
    root = typer.main.get_command(app)
    found = [(name, root.commands[name]) for name in ("infer", "serve")]
    found.append(("eval", root.commands["eval"].commands["run"]))
    train = root.commands["train"]  # its method commands are built from their specs
    context = typer.Context(train)
    found += [(f"train-{m}", train.get_command(context, m)) for m in methods.grpo_names()]
    return found


@pytest.mark.parametrize(("command", "click_command"), _config_commands())
def test_every_option_sets_a_key_its_config_has(command: str, click_command) -> None:
    """The protocol options built from the registry included (`get_params`)."""
    helps = field_help(opt.load_config_class(command))
    params = click_command.get_params(typer.Context(click_command))
    keys = [opt.config_key(p) for p in params]
    assert [k for k in keys if k is not None and k not in helps] == []
    assert {"model", "config", "set_"} <= {p.name for p in params}


@pytest.mark.parametrize(
    ("args", "command", "keys"),
    [
        (["eval", "run", "--help"], "eval", ["model", "sampling.n", "engine.kind", "out"]),
        (["infer", "--help"], "infer", ["model", "engine.api_key", "engine.served_model"]),
        (["infer", "--help"], "infer", ["protocol.teacher", "protocol.consult.self_collab"]),
        (["eval", "run", "--help"], "eval", ["protocol.experts", "protocol.planner"]),
        (["train", "relay", "--help"], "train-relay", ["protocol.teacher", "reward"]),
        (["serve", "--help"], "serve", ["model", "engine.kind", "api_key", "port"]),
    ],
)
def test_help_shows_the_config_fields_own_help(args: list[str], command: str, keys) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.stdout
    helps = field_help(opt.load_config_class(command))
    for key in keys:
        assert helps[key] in result.stdout, key
    assert opt._KEY_MARK not in result.stdout


# --- `collab eval` shorthand ---------------------------------------------------------------------


def test_eval_help_explains_the_shorthand() -> None:
    result = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "is short for `collab eval run BENCH" in result.stdout
    assert "report" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "--model", "/no/such/model", "aime24"],
        ["eval", "-c", "CONFIG", "aime24"],
        ["eval", "--set", "model=/no/such/model", "aime24"],
        ["eval", "aime24", "--model", "/no/such/model"],
    ],
)
def test_eval_routes_options_first_to_run(args, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "CONFIG").write_text("model: /no/such/model\n")
    message = _refused(args, tmp_path, monkeypatch)
    assert "unknown model '/no/such/model'" in message  # reached `run`, not "No such option"
    assert not (tmp_path / "runs").exists()  # and refused before creating a run folder


# --- values are checked before any model loads, naming the option --------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n", "0"], "--n: sampling.n must be between 1 and 1024, got 0"),
        (["--n", "-2"], "--n: sampling.n must be"),
        (["--n", str(10**20)], f"--n: sampling.n must be between 1 and 1024, got {10**20}"),
        (["--max-tokens", "0"], "--max-tokens: sampling.max_tokens must be"),
        (["--temperature", "-1"], "--temperature: sampling.temperature must be"),
        (["--temperature", "nan"], "--temperature: sampling.temperature must be"),
        (["--temperature", "inf"], "--temperature: sampling.temperature must be"),
        (["--top-p", "2"], "--top-p: sampling.top_p must be in (0, 1], got 2.0"),
        (["--top-p", "0"], "--top-p: sampling.top_p must be"),
        (["--seed", "-1"], "--seed: sampling.seed must be"),
        (["--batch-size", "0"], "--batch-size: engine.batch_size must be at least 1"),
        (["--set", "sampling.top_k=0"], "sampling.top_k must be -1 or >= 1"),
        (["--set", "engine.max_concurrency=0"], "engine.max_concurrency must be at least 1"),
        (["--set", "protocol.consult.accept_prob=2"], "consult.accept_prob must be in [0, 1]"),
        (["--set", "protocol.relay.max_call_tokens=0"], "relay.max_call_tokens must be >= 1"),
        (["--limit", "0"], "--limit must be >= 1"),
    ],
)
def test_eval_refuses_bad_values_before_anything_is_created(
    args: list[str], message: str, tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "run"
    got = _refused(["eval", "gsm8k", *args, "--out", str(out)], tmp_path, monkeypatch)
    assert got.startswith(message), got
    assert list(tmp_path.iterdir()) == []  # no run folder, not even the default one


def test_a_value_from_a_config_file_is_named_by_its_key(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "c.yaml").write_text("sampling:\n  n: 0\n")
    got = _refused(["eval", "gsm8k", "-c", "c.yaml"], tmp_path, monkeypatch)
    assert got.startswith("sampling.n must be")  # no --n was given, so none is named


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-tokens", "0"], "--max-tokens: sampling.max_tokens must be"),
        (["--temperature", "-0.5"], "--temperature: sampling.temperature must be"),
        (["--set", "protocol.consult.accept_prob=2"], "consult.accept_prob must be in [0, 1]"),
    ],
)
def test_infer_refuses_bad_values(args, message: str, tmp_path: Path, monkeypatch) -> None:
    got = _refused(["infer", "solo", "Hi", *args], tmp_path, monkeypatch)
    assert got.startswith(message), got


@pytest.mark.parametrize("out", ["a-file", "a-file/run", "/proc/no-such/run"])
def test_out_that_cannot_be_a_folder_is_refused(out: str, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    got = _refused(["eval", "gsm8k", "--out", out], tmp_path, monkeypatch)
    assert got.startswith(f"cannot write the run folder {out}: "), got
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_sampling_check_accepts_the_defaults_and_the_limits() -> None:
    SamplingConfig().check()
    SamplingConfig(n=1024, max_tokens=1, temperature=2.0, top_p=1e-9, top_k=1).check()


# --- config files: a section given as a scalar --------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("model: m\nsampling: 5\n", 2, "sampling"),
        ("sampling:\n", 1, "sampling"),
        ("protocol:\n  consult: [1, 2]\n", 2, "protocol.consult"),
    ],
)
def test_config_section_that_is_not_a_mapping_names_its_line(
    text: str, line: int, key: str, tmp_path: Path
) -> None:
    from collabrl.eval.config import EvalConfig

    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=rf"c\.yaml:{line}: config section '{key}' must be"):
        check_sections(EvalConfig, path)


def test_scalar_section_is_not_hidden_by_an_option(tmp_path: Path, monkeypatch) -> None:
    # Before: `--n 3` replaced `sampling: 5` in the merge and the mistake passed unseen.
    (tmp_path / "c.yaml").write_text("sampling: 5\n")
    got = _refused(["eval", "gsm8k", "-c", "c.yaml", "--n", "3"], tmp_path, monkeypatch)
    assert "c.yaml:1: config section 'sampling' must be a mapping" in got


# --- collab config show --------------------------------------------------------------------------


@pytest.mark.parametrize("command", sorted(opt.CONFIG_CLASSES))
def test_config_show_is_a_config_file_of_the_resolved_values(command: str, tmp_path) -> None:
    cls = opt.load_config_class(command)
    # The model a command runs: `teacher` for `filter`, whose teacher is its only model,
    # `models` for `evolve`, which runs several.
    key = {"filter": "teacher", "evolve": "models"}.get(command, "model")
    value = "[./somewhere]" if key == "models" else "./somewhere"
    result = runner.invoke(app, ["config", "show", command, "--set", f"{key}={value}"])
    assert result.exit_code == 0, result.stdout
    shown = build_config(cls, [yaml.safe_load(result.stdout)])
    assert shown == opt.load_config(command, None, {}, [f"{key}={value}"])
    for key, help_text in field_help(cls).items():
        assert f"# {help_text}\n" in result.stdout, key


def test_config_show_reads_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sampling:\n  n: 7\n")
    result = runner.invoke(app, ["config", "show", "eval", "-c", str(path)])
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["sampling"]["n"] == 7


@pytest.mark.parametrize(
    ("command", "setting", "problem"),
    [
        ("train-grpo", "steps=-1", "steps must be in [0, 10000000] (0: one epoch), got -1"),
        ("train-grpo", "trl.nonexistent=1", "trl.nonexistent is not a TRL GRPOConfig argument"),
        ("train-grpo", "reward=simple", "reward is read by collab train relay only"),
        ("eval", "sampling.n=0", "sampling.n must be between 1 and 1024"),
    ],
)
def test_config_show_refuses_what_the_command_would(command, setting, problem) -> None:
    result = runner.invoke(app, ["config", "show", command, "--set", setting])
    assert isinstance(result.exception, UserError)
    assert problem in str(result.exception)


@pytest.mark.parametrize("method", ["relay", "eapo", "rsim"])
def test_config_show_of_a_method_notes_the_collaborator_it_needs(method: str) -> None:
    result = runner.invoke(app, ["config", "show", f"train-{method}"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["method"] == method
    assert "note: the " in result.stderr and " needs " in result.stderr


def test_config_show_of_an_unknown_command() -> None:
    result = runner.invoke(app, ["config", "show", "train"])
    assert isinstance(result.exception, UserError)
    assert "no config for 'train'" in str(result.exception)


def test_describe_config_keeps_text_with_line_breaks_on_one_line() -> None:
    from collabrl.protocols.infer import InferConfig

    config = InferConfig(question="first line\nsecond\u2028third: {x}")
    text = describe_config(config)
    assert build_config(InferConfig, [yaml.safe_load(text)]) == config


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[2] / "configs" / "eval").glob("*.yaml"))
)
def test_every_shipped_config_resolves_and_passes_its_checks(path: Path) -> None:
    config = opt.load_config("eval", path, {}, [])
    config.check()


# --- protocol options come from the registry -----------------------------------------------------


@dataclass
class CriticOptions:
    """A registered-in-the-test protocol's options, as a plugin's (`protocol.options`)."""

    critic: str | None = option(None, "critic: the model that reviews the answer (a test's).")
    rounds: int = option(1, "Review rounds (a test's).")
    strict: bool = option(False, "Refuse on any doubt (a test's).")


def _show_options(config: ProtocolConfig) -> None:
    """Refuses every run, saying what reached the config (no model is loaded)."""
    raise UserError(f"given {sorted(config.options.items())}")


CRITIC = ProtocolSpec(
    name="critic",
    help="the policy answers and a critic reviews it",
    build=lambda ctx: None,  # never built: its check refuses every run
    collaborators=(
        Collaborator("critic", "options.critic", "--critic", served=True, author=Author.EXPERT),
    ),
    flags=(Flag("options.rounds", ("--rounds",)), Flag("options.strict", ("--strict",))),
    check=_show_options,
    grpo=False,
    options=CriticOptions,
)


@pytest.fixture
def critic() -> Iterator[ProtocolSpec]:
    registry.register(CRITIC)
    try:
        yield CRITIC
    finally:
        registry.unregister(CRITIC.name)


def test_a_registered_protocols_options_reach_its_config(critic) -> None:
    args = ["infer", "critic", "Hi", "--critic", "m", "--rounds", "3", "--strict"]
    result = runner.invoke(app, args)
    assert isinstance(result.exception, UserError), result.output
    assert str(result.exception) == "given [('critic', 'm'), ('rounds', 3), ('strict', True)]"
    typed = runner.invoke(app, ["infer", "critic", "Hi", "--rounds", "three"], env=WIDE)
    assert typed.exit_code == 2 and "Invalid value for '--rounds'" in typed.output


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["infer", "--help"], True),
        (["eval", "run", "--help"], True),
        (["train", "grpo", "--help"], False),  # its spec does not allow `collab train grpo`
        (["train", "relay", "--help"], False),  # a method offers its own protocol's only
    ],
)
def test_help_lists_a_registered_protocols_options(critic, args: list[str], shown: bool) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for flag, help_text in [("--critic", "critic: the model that reviews"), ("--rounds", "Review")]:
        assert (flag in result.stdout, help_text in result.stdout) == (shown, shown)


def test_options_of_an_unregistered_protocol_are_gone(critic) -> None:
    assert "--critic" in runner.invoke(app, ["infer", "--help"]).stdout
    registry.unregister(CRITIC.name)
    assert "--critic" not in runner.invoke(app, ["infer", "--help"]).stdout


def test_train_rsim_offers_no_planner_kind() -> None:
    result = runner.invoke(app, ["train", "rsim", "--help"], env={"COLUMNS": "400"})
    assert "--planner " in result.stdout and "--planner-kind" not in result.stdout


# --- an error's fix names options the running command has ---------------------------------------


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        # `collab train rsim` has no --planner-kind (it trains an rsim planner).
        (
            ["train", "rsim", "--model", "x", "--planner", "http://localhost:1/v1"],
            "a model reference, or --set protocol.strategy.planner_kind=prompting",
        ),
        # Commands that have the flags keep them.
        (["train", "eapo", "--model", "x"], "pass --expert MODEL_OR_URL, --self-collab, or --set"),
        (["infer", "relay", "Hi", "--model", "x"], "pass --teacher MODEL_OR_URL, or --set"),
        # `collab filter`'s --teacher is its own (its config has no protocol).
        (["filter", "--data", "arith"], "pass --teacher MODEL_OR_URL and/or --decontaminate"),
    ],
)
def test_an_errors_fix_names_a_flag_only_where_the_command_has_it(
    args: list[str], fix: str, tmp_path: Path, monkeypatch
) -> None:
    message = _refused(args, tmp_path, monkeypatch)
    assert fix in message, message


def test_config_show_notes_a_missing_collaborator_as_a_set() -> None:
    result = runner.invoke(app, ["config", "show", "train-eapo"])
    assert result.exit_code == 0, result.output
    assert (
        "pass --set protocol.experts=[MODEL_OR_URL], --set protocol.consult.self_collab=true, "
        in result.stderr
    )
