"""Protocols as plugins, collaborators declared once: the registry finds installed plugin
protocols through the `collabrl.protocols` entry points (a broken or clashing one is
skipped with one line), refuses a collaborator the running protocol does not declare,
whichever protocol declares it, and every collaborator pool is built by one helper."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from collabrl.config import EngineConfig, option
from collabrl.engines.base import SamplingParams
from collabrl.engines.calls import Call
from collabrl.engines.reference import Reference
from collabrl.errors import MissingInput, UserError
from collabrl.protocols import registry, relay
from collabrl.protocols.build import build_protocol
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.registry import check_protocol_config
from collabrl.protocols.solo import build_solo
from collabrl.protocols.spec import ProtocolSpec
from collabrl.protocols.strategy_config import StrategyConfig

# --- entry-point loading -------------------------------------------------------------------------

PLUGINS = {
    # A protocol that borrows relay's teacher: it declares the same collaborator.
    "collab_tutor": """
from collabrl.protocols.relay import TEACHER
from collabrl.protocols.solo import build_solo
from collabrl.protocols.spec import ProtocolSpec

SPEC = ProtocolSpec("tutor", "a tutor plugin", build_solo, collaborators=(TEACHER,))
""",
    "collab_broken": "raise ImportError('no module named torchvision')\n",
    "collab_clash": """
from collabrl.protocols.solo import build_solo
from collabrl.protocols.spec import ProtocolSpec

SPEC = ProtocolSpec("relay", "a second relay", build_solo)
""",
}
ENTRY_POINTS = """[collabrl.protocols]
tutor = collab_tutor:SPEC
broken = collab_broken:SPEC
clash = collab_clash:SPEC
"""


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Three installed plugin packages (as pip leaves them: modules and a dist-info with
    entry_points.txt on sys.path), and a registry that has not looked for plugins yet."""
    for module, source in PLUGINS.items():
        (tmp_path / f"{module}.py").write_text(source)
    dist = tmp_path / "collab_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: collab-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    monkeypatch.setattr(registry, "_BROKEN", {})
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    yield


def test_an_installed_plugin_protocol_is_registered_after_the_built_in_ones(
    plugins, capsys
) -> None:
    builtin = tuple(spec.name for spec in registry.BUILTIN)
    assert registry.names() == (*builtin, "tutor")
    assert registry.get("tutor").help == "a tutor plugin"
    # The built-in relay stands; the clashing plugin and the broken one are one line each.
    assert registry.get("relay") is relay.SPEC
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert "'broken'" in lines[0] and "ImportError: no module named torchvision" in lines[0]
    assert "'clash'" in lines[1] and "the name 'relay' is taken" in lines[1]
    registry.names()  # loaded once: no second warning
    assert capsys.readouterr().err == ""


def test_a_broken_plugin_is_named_in_the_unknown_protocol_error(plugins) -> None:
    with pytest.raises(UserError) as err:
        registry.get("broken")
    message = str(err.value)
    assert "unknown protocol 'broken'" in message and "\n" not in message
    assert "plugins that failed to load: broken: ImportError" in message


# A plugin package's module, malformed in one way each: what its one warning line says.
SOLO = """
from dataclasses import dataclass
from collabrl.config import option
from collabrl.protocols.solo import build_solo
from collabrl.protocols.spec import Collaborator, Flag, ProtocolSpec
@dataclass
class Options:
    rounds: int = option(1, "Rounds.")
class NotADataclass:
    rounds: int = 1
"""
MALFORMED = {
    "a flag of a key its options lack": (
        'SPEC = ProtocolSpec("m", "h", build_solo, options=Options, '
        'flags=(Flag("options.nope", ("--nope",)),))',
        "protocol.options.nope is no config field",
    ),
    "a flag without an options class": (
        'SPEC = ProtocolSpec("m", "h", build_solo, flags=(Flag("options.rounds", ("--r",)),))',
        "protocol.options.rounds is no config field",
    ),
    "a name that is no text": ('SPEC = ProtocolSpec(123, "h", build_solo)', "the name 123"),
    "an options class that is no dataclass": (
        'SPEC = ProtocolSpec("m", "h", build_solo, options=NotADataclass)',
        "options is not a dataclass class",
    ),
    "an option declared as no option": (
        'SPEC = ProtocolSpec("m", "h", build_solo, options=Options, '
        'flags=(Flag("options.rounds", ("rounds",)),))',
        "'rounds' is not an option",
    ),
    "a key of its own outside its options": (
        'SPEC = ProtocolSpec("m", "h", build_solo, flags=(Flag("tokenizer", ("--tok",)),))',
        "protocol.tokenizer is not its own",
    ),
    "a key in another protocol's section": (
        'SPEC = ProtocolSpec("m", "h", build_solo, flags=(Flag("consult.self_collab", '
        '("--self-collab",)),))',
        "protocol.consult.self_collab is not its own",
    ),
    "a section that is no section": (
        'SPEC = ProtocolSpec("m", "h", build_solo, section="tokenizer")',
        "section 'tokenizer' is not one of",
    ),
    "collaborators that are no tuple": (
        'SPEC = ProtocolSpec("m", "h", build_solo, collaborators=["teacher"])',
        "collaborators is not a tuple of Collaborator",
    ),
    "a sys.exit at import": ("raise SystemExit(0)", "it exited while loading (SystemExit 0)"),
}


def _install(root: Path, module: str, source: str, entry_points: str) -> None:
    """A plugin package as pip leaves it: its module and a dist-info on sys.path."""
    (root / f"{module}.py").write_text(source)
    dist = root / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def fresh_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry that has not looked for plugins yet, and a folder on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    monkeypatch.setattr(registry, "_BROKEN", {})
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    return tmp_path


@pytest.mark.parametrize(("source", "why"), MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_plugin_is_one_warning_and_skipped(
    fresh_registry: Path, capsys, source: str, why: str
) -> None:
    """Before, each of these was registered and broke every command later (a KeyError or
    TypeError traceback in the CLI's options or help), or ended `collab` with exit 0."""
    module = f"collab_{fresh_registry.name}"  # one per test: Python keeps what it imported
    _install(fresh_registry, module, SOLO + source, f"[collabrl.protocols]\nm = {module}:SPEC\n")
    assert registry.names() == tuple(spec.name for spec in registry.BUILTIN)
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"collabrl: skipped the protocol plugin 'm' ({module}:SPEC)")
    assert why in line
    with pytest.raises(UserError, match="plugins that failed to load: m: "):
        registry.get("m")


def test_an_unreadable_entry_points_file_skips_that_package_alone(
    fresh_registry: Path, capsys
) -> None:
    """A malformed entry_points.txt (a line without `=`) made importlib.metadata raise for
    every package: before, every command failed with a TypeError traceback."""
    _install(fresh_registry, "collab_garbled", "", "[collabrl.protocols]\nno equals sign\n")
    fine = SOLO + 'SPEC = ProtocolSpec("fine", "a plugin beside a broken one", build_solo)\n'
    _install(fresh_registry, "collab_fine", fine, "[collabrl.protocols]\nfine = collab_fine:SPEC\n")
    assert registry.names()[-1] == "fine"
    [line] = capsys.readouterr().err.splitlines()
    assert "collab_garbled-0.1.dist-info" in line


EXAMPLE = Path(__file__).parents[2] / "examples" / "collab-echo"


def test_a_built_in_and_the_example_plugin_register_through_one_function(
    fresh_registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built-in and installed protocols go the same way: an entry point, loaded and checked
    by `_register_point`, whose spec `register` adds; nothing else registers either."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))
    [(name, value)] = project["project"]["entry-points"][registry.ENTRY_POINT_GROUP].items()
    # Installed as pip leaves it: its module on sys.path, its dist-info beside.
    dist = fresh_registry / "collab_echo-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: collab-echo\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{name} = {value}\n")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setattr(registry, "_SPECS", {})
    through: list[tuple[str, str]] = []  # (entry point, the spec it registered)
    register_point = registry._register_point

    def spy(point: EntryPoint) -> ProtocolSpec:
        spec = register_point(point)
        through.append((point.value, spec.name))
        return spec

    monkeypatch.setattr(registry, "_register_point", spy)
    builtin = registry._register_builtins()  # what loading the registry runs
    names = registry.names()  # the first query: the installed plugins
    assert through == [
        *((f"collabrl.protocols.{spec.name}:SPEC", spec.name) for spec in builtin),
        ("collab_echo:SPEC", "echo"),
    ]
    assert names == (*(spec.name for spec in registry.BUILTIN), "echo")
    assert registry.get("relay") is relay.SPEC  # the module's own spec, not a copy


@dataclass
class Rounds:
    """A plugin's options class with a check of its own, as RelayConfig has."""

    rounds: int = option(1, "Rounds.")

    def check(self) -> None:
        if self.rounds < 1:
            raise UserError("protocol.options.rounds must be >= 1", "give 1 or more")


def test_a_plugins_options_are_checked_by_their_class_as_a_section_is(fresh_registry) -> None:
    registry.register(ProtocolSpec("rounds", "a plugin with a check", build_solo, options=Rounds))
    check_protocol_config(ProtocolConfig(name="rounds", options={"rounds": 2}))
    with pytest.raises(UserError, match="rounds must be >= 1"):
        check_protocol_config(ProtocolConfig(name="rounds", options={"rounds": 0}))


def test_a_ctrl_c_while_a_plugin_imports_stays_an_interrupt(fresh_registry: Path) -> None:
    points = "[collabrl.protocols]\nc = collab_ctrl_c:SPEC\n"
    _install(fresh_registry, "collab_ctrl_c", "raise KeyboardInterrupt\n", points)
    with pytest.raises(KeyboardInterrupt):
        registry.names()


def test_a_plugin_sharing_a_collaborator_takes_it_and_is_listed_as_its_user(plugins) -> None:
    check_protocol_config(ProtocolConfig(name="tutor", teacher="reference"))
    with pytest.raises(UserError, match="use a protocol that has: relay, tutor"):
        check_protocol_config(ProtocolConfig(name="solo", teacher="reference"))
    assert [c.key for c in registry.collaborators()].count("teacher") == 1


# --- collaborators declared once -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "given", "who"),
    [
        (
            "solo",
            {"teacher": "reference"},
            "protocol.teacher is set, but the solo protocol has no teacher",
        ),
        (
            "relay",
            {"experts": ["reference"]},
            "the relay protocol has no experts; drop it, or use a protocol that has: consult",
        ),
        (
            "consult",
            {"planner": "m", "experts": ["reference"]},
            "has no planner; drop it, or use a protocol that has: strategy",
        ),
    ],
)
def test_a_collaborator_the_protocol_does_not_declare_is_refused(name, given, who) -> None:
    with pytest.raises(UserError, match=who):
        check_protocol_config(ProtocolConfig(name=name, **given))


def test_a_protocols_own_check_names_its_collaborators_flag() -> None:
    # The CLI rewrites a flag its command lacks into --set protocol.KEY=VALUE; the flag
    # it names is the one the spec declares.
    for name, collaborator in (
        ("relay", "teacher"),
        ("consult", "experts"),
        ("strategy", "planner"),
    ):
        spec = registry.get(name)
        [declared] = [c for c in spec.collaborators if c.name == collaborator]
        with pytest.raises(MissingInput) as err:
            check_protocol_config(ProtocolConfig(name=name))
        assert f"pass {declared.flag} MODEL_OR_URL" in str(err.value)


def test_the_served_collaborators_are_what_the_spec_declares_served() -> None:
    relay_ = ProtocolConfig(name="relay", teacher="http://t:1/v1")
    assert registry.collaborators_of(relay_) == ["http://t:1/v1"]
    consult = ProtocolConfig(name="consult", experts=["a", "b"])
    assert registry.collaborators_of(consult) == ["a", "b"]
    # The rsim planner runs in-process; a prompted one is served (probed, listed).
    rsim = ProtocolConfig(name="strategy", planner="some/planner")
    assert registry.collaborators_of(rsim) == []
    prompted = StrategyConfig(planner_kind="prompting")
    asked = ProtocolConfig(name="strategy", planner="http://p:1/v1", strategy=prompted)
    assert registry.collaborators_of(asked) == ["http://p:1/v1"]
    # Apollo's tools are its section: never a model to list.
    assert registry.collaborators_of(ProtocolConfig(name="apollo")) == []


def test_an_rsim_planner_at_a_url_is_refused_by_the_strategy_check() -> None:
    config = ProtocolConfig(name="strategy", planner="http://p:1/v1")
    with pytest.raises(UserError, match="an rsim planner runs in-process"):
        check_protocol_config(config)


# --- one helper builds every collaborator's engine and pool --------------------------------------

POLICY_ENGINE = EngineConfig(
    device="cpu",
    dtype="bfloat16",
    api_key="key",
    served_model="the-policy",
    chat_template_kwargs={"policy": True},
)


def test_a_prompted_planner_gets_a_collaborators_engine_not_the_policys(
    tiny_model_dir: Path, tiny_engine
) -> None:
    """Before, the planner copied the policy's engine options: the policy's served model
    name was requested at the planner's server."""
    config = ProtocolConfig(
        name="strategy",
        planner="http://127.0.0.1:1/v1",
        strategy=StrategyConfig(planner_kind="prompting"),
        chat_template_kwargs={"enable_thinking": False},
    )
    protocol = build_protocol(config, str(tiny_model_dir), POLICY_ENGINE, policy_engine=tiny_engine)
    try:
        planner = protocol.planner.engine
        assert planner.model is None  # the policy's served model name stays the policy's
        assert planner.chat_template_kwargs == {"enable_thinking": False}
    finally:
        protocol.close()


def test_the_consult_warmup_pool_serves_every_expert_with_the_builders_engine() -> None:
    from collabrl.builders.consult_warmup import ConsultWarmupConfig, _expert_pool

    engine = EngineConfig(api_key="key", served_model="expert-model")
    config = ConsultWarmupConfig(expert="reference", num_experts=3, engine=engine)
    with _expert_pool(config) as pool:
        assert pool.config.num_experts == 3
        # A served expert is asked with the builder's own key and model name.
        assert (pool.engine_config.api_key, pool.engine_config.served_model) == (
            "key",
            "expert-model",
        )
        calls = [Call(k, [{"role": "user", "content": "2+2?"}], Reference("4")) for k in (1, 3)]
        records = pool.ask_sync(calls, SamplingParams(max_tokens=50))
    assert [r.outcome for r in records] == ["ok", "ok"]
