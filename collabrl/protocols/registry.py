"""The protocol registry: one `ProtocolSpec` per protocol, looked up by name.

Everything outside a protocol's own code that depends on which protocol runs asks its
spec (`protocols/spec.py`): how it is built (`protocols/build.py`), which prompt the policy
answers in, the setup it refuses (`check_protocol_config`), the collaborators it brings in
(the CLI's flags, the dry run's listing, eval's probe), whether `collab train grpo` may
roll out on it, the extras a trainer reads of its episodes and the help of `--protocol`.

A protocol is one module that defines `SPEC` next to its class. The five built-in ones are
imported explicitly below; a third-party protocol is a package whose entry point in the
group `collabrl.protocols` loads to its `ProtocolSpec` (`echo = "collab_echo:SPEC"`), found
once, on the first query (see docs/protocols/README.md, "Adding a protocol"). A test may
`register(spec)` one for its duration.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from collabrl.engines.reference import stand_in_accuracy
from collabrl.errors import UserError
from collabrl.protocols import apollo, consult, relay, solo, strategy
from collabrl.protocols.spec import Collaborator, Flag, ProtocolSpec

if TYPE_CHECKING:
    from collabrl.protocols.config import ProtocolConfig

# Where an installed package registers a protocol: each entry point loads to a ProtocolSpec.
ENTRY_POINT_GROUP = "collabrl.protocols"

BUILTIN: tuple[ProtocolSpec, ...] = (
    solo.SPEC,
    relay.SPEC,
    consult.SPEC,
    strategy.SPEC,
    apollo.SPEC,
)

# The registered protocols by name, in registration order (the built-in ones first).
_SPECS: dict[str, ProtocolSpec] = {}
# Plugins that could not be loaded, by entry-point name: why (the unknown-name error says).
_BROKEN: dict[str, str] = {}
_plugins_loaded = False


def register(spec: ProtocolSpec) -> ProtocolSpec:
    """Add a protocol; its name must be new (`unregister` frees one), and a collaborator
    or flag it shares with a registered protocol must be declared the same (the CLI has
    one option per config key)."""
    if spec.name in _SPECS:
        raise ValueError(f"a protocol named {spec.name!r} is already registered")
    for collaborator in spec.collaborators:
        if collaborator.served and collaborator.author is None:
            raise ValueError(
                f"protocol {spec.name}: collaborator {collaborator.name!r} is served, so it "
                "writes segments: declare their author"
            )
    _check_declarations(spec)
    _SPECS[spec.name] = spec
    return spec


def _check_declarations(spec: ProtocolSpec) -> None:
    """Refuse a key declared otherwise than by a registered protocol, or a CLI option
    declared for two keys."""
    known: dict[str, Collaborator | Flag] = {**_by_key(_collaborators()), **_by_key(_flags())}
    options = {decl: key for key, item in known.items() for decl in _decls(item)}
    for item in (*spec.collaborators, *spec.flags):
        if item.key in known and known[item.key] != item:
            raise ValueError(
                f"protocol {spec.name}: protocol.{item.key} is declared otherwise by "
                f"{_declarer(item.key)} (share its declaration)"
            )
        for decl in _decls(item):
            if options.get(decl, item.key) != item.key:
                raise ValueError(
                    f"protocol {spec.name}: {decl} already sets protocol.{options[decl]}"
                )


def _declarer(key: str) -> str:
    """The first registered protocol that declares `key`."""
    for spec in _SPECS.values():
        if key in {item.key for item in (*spec.collaborators, *spec.flags)}:
            return spec.name
    raise KeyError(key)


def _decls(item: Collaborator | Flag) -> tuple[str, ...]:
    if isinstance(item, Flag):
        return item.decls
    return (item.flag,) if item.flag else ()


def unregister(name: str) -> None:
    """Remove a registered protocol (a test's, or a plugin's being replaced)."""
    _SPECS.pop(name, None)


def _load_plugins() -> None:
    """Register every installed plugin protocol, once. One that fails to load, or whose
    name is taken, is skipped with one line on stderr: a broken third-party package must
    not stop the built-in protocols (the unknown-name error names it)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = point.load()
            if not isinstance(spec, ProtocolSpec):
                raise TypeError(f"{point.value} is a {type(spec).__name__}, not a ProtocolSpec")
            if spec.name in _SPECS:
                raise ValueError(f"the name {spec.name!r} is taken")
            register(spec)
        except Exception as error:  # whatever a plugin raises is the plugin's failure
            _BROKEN[point.name] = f"{type(error).__name__}: {error}"
            print(
                f"collabrl: skipped the protocol plugin '{point.name}' ({point.value}): "
                f"{_BROKEN[point.name]}",
                file=sys.stderr,
            )


def _registered() -> dict[str, ProtocolSpec]:
    _load_plugins()
    return _SPECS


def names() -> tuple[str, ...]:
    """The registered protocol names, the built-in ones first."""
    return tuple(_registered())


def specs() -> tuple[ProtocolSpec, ...]:
    """Every registered protocol's spec, the built-in ones first."""
    return tuple(_registered().values())


def get(name: str) -> ProtocolSpec:
    """The spec of protocol `name`; a one-line UserError listing the names otherwise."""
    spec = _registered().get(name)
    if spec is None:
        fix = f"use one of {', '.join(names())}"
        if _BROKEN:
            broken = "; ".join(f"{plugin}: {why}" for plugin, why in _BROKEN.items())
            fix += f" (plugins that failed to load: {broken})"
        raise UserError(f"unknown protocol '{name}'", fix)
    return spec


def find(name: object) -> ProtocolSpec | None:
    """The spec of protocol `name`, or None (an episode from an unregistered protocol)."""
    return _registered().get(name) if isinstance(name, str) else None


def metric_keys() -> tuple[str, ...]:
    """Every registered protocol's logged extras, each once, in registration order."""
    return tuple(dict.fromkeys(key for spec in specs() for key in spec.metric_keys))


def protocol_help() -> str:
    """The help of `--protocol`: every registered protocol and its line."""
    listed = " ".join(f"{spec.name}: {spec.help}." for spec in specs())
    return f"Who writes next. {listed} See docs/protocols/."


def _by_key(items: list[Any]) -> dict[str, Any]:
    """Each item once by its config key, the first declaration kept."""
    found: dict[str, Any] = {}
    for item in items:
        found.setdefault(item.key, item)
    return found


def _collaborators() -> list[Collaborator]:
    return [c for spec in _SPECS.values() for c in spec.collaborators]


def _flags() -> list[Flag]:
    return [f for spec in _SPECS.values() for f in spec.flags]


def collaborators() -> tuple[Collaborator, ...]:
    """Every registered protocol's collaborators, each once by config key (the CLI builds
    one option of each)."""
    _load_plugins()
    return tuple(_by_key(_collaborators()).values())


def flags() -> tuple[Flag, ...]:
    """Every registered protocol's own flags, each once by config key."""
    _load_plugins()
    return tuple(_by_key(_flags()).values())


def read_options(config: ProtocolConfig) -> Any:
    """The protocol's own options from `protocol.options`, as its spec's options class
    (None for a protocol without one, which must get none)."""
    from collabrl.config import build_config

    spec = get(config.name)
    if spec.options is None:
        if config.options:
            where = f" (its own are under protocol.{spec.section})" if spec.section else ""
            raise UserError(
                f"protocol.options: the {spec.name} protocol takes no options there{where}",
                "drop protocol.options",
            )
        return None
    return build_config(spec.options, [config.options], prefix="protocol.options.")


# -- what a config's collaborators are, whichever protocol declares them -----------------

OPTIONS_PREFIX = "options."


def collaborator_value(
    config: ProtocolConfig, collaborator: Collaborator
) -> str | list[str] | None:
    """What `config` gives for `collaborator`: a model reference or base URL, a list of
    them, or None. A plugin's ("options.KEY") is read raw from `protocol.options`; a
    section (apollo's tools) is configuration, never "given", so None."""
    if collaborator.key.startswith(OPTIONS_PREFIX):
        value = config.options.get(collaborator.key.removeprefix(OPTIONS_PREFIX))
    else:
        value = getattr(config, collaborator.key)
    if isinstance(value, str) or (isinstance(value, list) and value):
        return value
    return None


def collaborator_refs(config: ProtocolConfig, collaborator: Collaborator) -> list[str]:
    """`collaborator_value` as a list: none, one, or a list's references."""
    value = collaborator_value(config, collaborator)
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def check_collaborators(config: ProtocolConfig) -> None:
    """Refuse a collaborator the running protocol never calls (`--protocol solo --teacher
    X` would otherwise run without it, silently). A plugin's, under `protocol.options`, is
    refused by the running protocol's options class instead."""
    own = {c.key for c in get(config.name).collaborators}
    for collaborator in collaborators():
        key = collaborator.key
        if key in own or key.startswith(OPTIONS_PREFIX):
            continue
        if collaborator_value(config, collaborator) is not None:
            users = [s.name for s in specs() if key in {c.key for c in s.collaborators}]
            raise UserError(
                f"protocol.{key} is set, but the {config.name} protocol has no {collaborator.name}",
                f"drop it, or use a protocol that has: {', '.join(users)}",
            )


def served_collaborators(config: ProtocolConfig) -> list[tuple[Collaborator, str]]:
    """The models the running protocol calls beside the policy, as model references or
    base URLs, each with its declaration: the dry run lists them, eval and training probe
    them (an in-process rsim planner is not one: it trains beside the policy)."""
    found = []
    for collaborator in get(config.name).collaborators:
        if collaborator.serves(config):
            found += [(collaborator, ref) for ref in collaborator_refs(config, collaborator)]
    return found


def collaborators_of(config: ProtocolConfig) -> list[str]:
    """The model references and base URLs of `served_collaborators`."""
    return [ref for _, ref in served_collaborators(config)]


def check_protocol_config(config: ProtocolConfig) -> None:
    """Refuse a setup that cannot run, before any model is loaded: every sub-config is
    checked, whichever protocol runs, so a typo never waits for a model load; then the
    collaborators it is given, and the protocol's own check (relay needs a teacher)."""
    spec = get(config.name)  # an unknown name lists the registered ones
    config.relay.check()
    config.consult.check()
    config.strategy.check()
    config.apollo.check()
    read_options(config)
    check_collaborators(config)
    for collaborator in collaborators():
        if collaborator.served:
            for ref in collaborator_refs(config, collaborator):
                stand_in_accuracy(ref)  # `reference@2` is refused here, not at its first call
    spec.check(config)


def uses_reference(config: ProtocolConfig) -> bool:
    """Whether a collaborator that this protocol runs is the `reference` stand-in, which
    reads each task's gold answer (outputs must say so)."""
    return get(config.name).uses_reference(config)


for _spec in BUILTIN:
    register(_spec)
