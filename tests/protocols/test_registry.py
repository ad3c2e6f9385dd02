"""The protocol registry: a protocol defined and registered here only, "echo", runs
through `collab infer`, `collab eval` and a GRPO step without an edit anywhere else;
unknown names are refused in one line that lists the registered ones."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from collabrl import runs
from collabrl.cli.main import app
from collabrl.config import DecodingConfig, SamplingConfig, option
from collabrl.data.benchmarks import load_benchmark
from collabrl.data.prompts import PromptTemplate, get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.episode import Episode
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.runner import run_eval
from collabrl.protocols import registry, relay
from collabrl.protocols.base import CollabProtocol, Policy, Task
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.registry import check_protocol_config
from collabrl.protocols.solo import SoloProtocol
from collabrl.protocols.spec import BuildContext, Collaborator, Flag, ProtocolSpec
from collabrl.train.grpo import train_grpo
from collabrl.train.grpo_config import GRPOTrainConfig
from collabrl.train.resolve import resolve_run
from collabrl.train.run import METRICS

BUILTIN = tuple(spec.name for spec in registry.BUILTIN)

runner = CliRunner()


# --- the toy protocol: answers once, like solo, and marks its episodes ---------------------------


@dataclass
class EchoOptions:
    """The echo protocol's own options (`protocol.options`)."""

    mark: str = option("echo", "What every echo episode carries in meta['mark'].")


class EchoProtocol(SoloProtocol):
    name = "echo"  # new_episodes records it as every episode's meta["protocol"]

    def __init__(
        self, policy: Policy, template: PromptTemplate, extract: tuple[str, ...], mark: str
    ) -> None:
        super().__init__(policy, template, extract)
        self.mark = mark

    def run(self, tasks: list[Task], params: SamplingParams) -> list[Episode]:
        episodes = super().run(tasks, params)
        for episode in episodes:
            episode.meta["mark"] = self.mark
        return episodes


def build_echo(ctx: BuildContext) -> CollabProtocol:
    return EchoProtocol(ctx.policy, ctx.template, ctx.extract, ctx.options.mark)


def echo_extras(episode: Episode) -> dict[str, Any]:
    return {"echoed": float("mark" in episode.meta)}


ECHO = ProtocolSpec(
    name="echo",
    help="the policy answers once and its episodes are marked",
    build=build_echo,
    episode_extras=echo_extras,
    metric_keys=("echoed",),
    options=EchoOptions,
)


@pytest.fixture(autouse=True)
def builtin_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in protocols only: an installed plugin (the example `echo` package) stays
    out of these tests, which register their own."""
    monkeypatch.setattr(registry, "_SPECS", {spec.name: spec for spec in registry.BUILTIN})
    monkeypatch.setattr(registry, "_plugins_loaded", True)


@pytest.fixture
def echo() -> Iterator[ProtocolSpec]:
    """The echo protocol, registered for one test only."""
    registry.register(ECHO)
    try:
        yield ECHO
    finally:
        registry.unregister(ECHO.name)


# --- infer, eval, one GRPO step -------------------------------------------------------------------


def test_echo_runs_through_collab_infer(echo, tiny_model_dir: Path) -> None:
    args = ["infer", "echo", "What is 2 + 3?", "--model", str(tiny_model_dir)]
    args += ["--max-tokens", "6", "--set", "protocol.options.mark=hello", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (result.exception, result.stdout)
    episode = json.loads(result.stdout.strip().splitlines()[-1])
    assert episode["meta"]["protocol"] == "echo"
    assert episode["meta"]["mark"] == "hello"  # its own option, through --set


def test_echo_runs_through_collab_eval(echo, tiny_model_dir: Path, tiny_engine, tmp_path) -> None:
    config = EvalConfig(
        benchmark="arith",
        model=str(tiny_model_dir),
        limit=2,
        out=str(tmp_path / "run"),
        protocol=ProtocolConfig(name="echo"),
        sampling=SamplingConfig(max_tokens=6),
    )
    result = run_eval(config, engine=tiny_engine)
    assert result.new_samples == 2 and result.metrics["problems"] == 2
    samples = runs.read_records(result.out_dir / runs.SAMPLES)
    bench = load_benchmark("arith", limit=2)
    template = get_prompt(bench.prompt)  # its spec answers in the benchmark's prompt, as solo
    for sample, item in zip(samples, bench.items, strict=True):
        meta = sample["episode"]["meta"]
        assert (meta["protocol"], meta["mark"]) == ("echo", "echo")  # the option's default
        assert meta["prompt"] == template.messages(item.problem)


def test_echo_trains_one_grpo_step(echo, tiny_model_dir: Path, tmp_path) -> None:
    config = GRPOTrainConfig(
        model=str(tiny_model_dir),
        data="arith_train",
        limit=4,
        out=str(tmp_path),
        steps=1,
        prompts_per_step=2,
        sampling=DecodingConfig(n=2, max_tokens=8, temperature=1.0),
        protocol=ProtocolConfig(name="echo", options={"mark": "trained"}),
    )
    result = train_grpo(resolve_run(config))
    assert result.steps == 1
    [logged] = [r for r in runs.read_records(tmp_path / METRICS) if "reward" in r]
    assert logged["episodes/echoed"] == 1.0  # its spec's extras, logged as its metric key


# --- refusals and bookkeeping ---------------------------------------------------------------------


def test_unknown_protocol_names_are_refused_in_one_line_listing_the_names(echo) -> None:
    listed = f"use one of {', '.join(BUILTIN)}, echo"
    with pytest.raises(UserError) as err:
        check_protocol_config(ProtocolConfig(name="ecko"))
    assert str(err.value) == f"unknown protocol 'ecko'; {listed}"
    assert "\n" not in str(err.value)
    result = runner.invoke(app, ["infer", "ecko", "What is 2 + 3?"])
    assert isinstance(result.exception, UserError)
    assert str(result.exception).endswith(listed)


def test_grpo_rolls_out_on_the_protocols_whose_spec_allows_it(echo, tmp_path) -> None:
    config = GRPOTrainConfig(out=str(tmp_path), protocol=ProtocolConfig(name="relay"))
    with pytest.raises(UserError, match="rolls out on solo or apollo or echo, not 'relay'"):
        config.check()


def test_a_protocols_own_options_are_checked_by_its_class(echo) -> None:
    with pytest.raises(UserError, match="unknown config key 'protocol.options.marc'"):
        check_protocol_config(ProtocolConfig(name="echo", options={"marc": "x"}))
    with pytest.raises(UserError, match="the solo protocol takes no options there"):
        check_protocol_config(ProtocolConfig(name="solo", options={"mark": "x"}))


def test_a_name_is_registered_once(echo) -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(ECHO)


def test_a_collaborator_or_flag_is_declared_once_across_protocols() -> None:
    # The CLI has one option per config key: a second declaration must be the same one.
    other_teacher = dataclasses.replace(relay.TEACHER, flag="--mentor")
    taken_flag = Flag("options.mark", ("--teacher",))
    silent = Collaborator("critic", key="options.mark", flag="--critic", served=True)
    for spec, match in [
        (ProtocolSpec("x", "x", build_echo, collaborators=(other_teacher,)), "declared otherwise"),
        (
            ProtocolSpec("x", "x", build_echo, flags=(taken_flag,), options=EchoOptions),
            "--teacher already sets",
        ),
        (
            ProtocolSpec("x", "x", build_echo, collaborators=(silent,), options=EchoOptions),
            "declare their author",
        ),
    ]:
        with pytest.raises(ValueError, match=match):
            registry.register(spec)
        assert "x" not in registry.names()
    # The same declaration in a second protocol is fine: both share the one option.
    registry.register(ProtocolSpec("x", "x", build_echo, collaborators=(relay.TEACHER,)))
    try:
        assert [c.key for c in registry.collaborators()].count("teacher") == 1
    finally:
        registry.unregister("x")


def test_protocol_help_lists_every_registered_protocol(echo) -> None:
    result = runner.invoke(app, ["infer", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    text = re.sub(r"[│\s]+", " ", result.stdout)  # the help text, unwrapped
    for name in (*BUILTIN, "echo"):
        assert f"{name}: {registry.get(name).help}." in text


def test_the_built_in_specs_say_which_bring_their_own_prompt() -> None:
    own = [name for name in BUILTIN if registry.get(name).own_prompt]
    assert own == ["consult", "strategy", "apollo"]
    assert [name for name in BUILTIN if registry.get(name).bench_prompt] == ["solo"]
