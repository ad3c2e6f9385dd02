"""The protocol registry: one `ProtocolSpec` per protocol, looked up by name.

Everything outside a protocol's own code that depends on which protocol runs asks its
spec (`protocols/spec.py`): how it is built (`protocols/build.py`), which prompt the policy
answers in, the setup it refuses (`check_protocol_config`), the collaborators it brings in
(the CLI's flags, the dry run's listing, eval's probe), whether `collab train grpo` may
roll out on it, the extras a trainer reads of its episodes and the help of `--protocol`.

A protocol is one module that defines `SPEC` next to its class, named by an entry point in
the group `collabrl.protocols` (`echo = "collab_echo:SPEC"`), and every one is registered
the same way: `_register_point` loads the entry point and `register`s its spec, under the
same checks. The built-in ones' entry points are listed here (`BUILTIN_POINTS`) and
registered first, when this module loads; an installed package's are found in its
metadata once, on the first query (see docs/protocols/README.md, "Adding a protocol").
A test may `register(spec)` one for its duration.
"""

from __future__ import annotations

import re
import sys
import typing
from dataclasses import is_dataclass
from importlib.metadata import EntryPoint, distributions, entry_points
from pathlib import Path
from typing import Any

from collabrl.engines.reference import stand_in_accuracy
from collabrl.episode import Author
from collabrl.errors import UserError, unknown_name
from collabrl.protocols.config import COMMON_FIELDS, ProtocolConfig
from collabrl.protocols.spec import Collaborator, Flag, PolicyPrompt, ProtocolSpec

# The entry-point group of every protocol, built-in or installed: each loads to a ProtocolSpec.
ENTRY_POINT_GROUP = "collabrl.protocols"

# The built-in protocols, as entry points like any installed package's. Listed here, not
# in collabrl's own package metadata, so that a source checkout that was never installed
# has them too; registered by `_register_point` all the same.
BUILTIN_POINTS: tuple[EntryPoint, ...] = tuple(
    EntryPoint(name, f"collabrl.protocols.{name}:SPEC", ENTRY_POINT_GROUP)
    for name in ("solo", "relay", "consult", "strategy", "apollo")
)

# The registered protocols by name, in registration order (the built-in ones first).
_SPECS: dict[str, ProtocolSpec] = {}
# A plugin's own config keys are fields of its options class, under `protocol.options`.
OPTIONS_PREFIX = "options."

# Plugins that could not be loaded, by entry-point name: why (the unknown-name error says).
_BROKEN: dict[str, str] = {}
_plugins_loaded = False


def register(spec: ProtocolSpec) -> ProtocolSpec:
    """Add a protocol, built-in or a plugin's alike; its name must be new (`unregister`
    frees one), every field of the spec what the rest of collabrl reads it as
    (`_check_spec`), and a collaborator or flag it shares with a registered protocol must
    be declared the same (the CLI has one option per config key)."""
    _check_spec(spec)
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


# A protocol name: a word of the command line (`collab infer NAME`) and of a YAML value.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# An option a protocol declares: `--word-word` or `-x` (click reads anything else as a
# parameter name, or refuses it only when the command is built).
_DECL = re.compile(r"--[a-z0-9][a-z0-9-]*|-[A-Za-z0-9]")
# What a protocol option may set, so that click can parse it: a scalar, or a list of them.
_OPTION_SCALARS = (str, int, float, bool, Path)
_SPEC_FUNCTIONS = ("build", "check", "uses_reference", "calls", "episode_extras")


def _check_spec(spec: ProtocolSpec) -> None:
    """Refuse a spec whose fields the rest of collabrl could not read: a plugin's mistake
    must fail its own registration (one line, the plugin skipped), never later in the
    code every command shares (the CLI's options, help, the unknown-name error)."""
    if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
        raise ValueError(f"the name {spec.name!r} is not letters, digits, '_', '-' or '.'")
    if not isinstance(spec.help, str):
        raise TypeError(f"protocol {spec.name}: help is a {type(spec.help).__name__}, not text")
    for name in _SPEC_FUNCTIONS:
        if not callable(getattr(spec, name)):
            raise TypeError(f"protocol {spec.name}: {name} is not callable")
    if spec.template is not None and not callable(spec.template):
        raise TypeError(f"protocol {spec.name}: template is not callable")
    if not isinstance(spec.prompt, PolicyPrompt):
        raise TypeError(f"protocol {spec.name}: prompt is not a PolicyPrompt")
    if not isinstance(spec.grpo, bool):
        raise TypeError(f"protocol {spec.name}: grpo is not a bool")
    if not (spec.call_syntax is None or isinstance(spec.call_syntax, str)):
        raise TypeError(f"protocol {spec.name}: call_syntax is neither None nor text")
    if not _tuple_of(spec.metric_keys, str):
        raise TypeError(f"protocol {spec.name}: metric_keys is not a tuple of text")
    if spec.section is not None and spec.section not in _sections():
        raise ValueError(
            f"protocol {spec.name}: section {spec.section!r} is not one of protocol."
            f"{', protocol.'.join(_sections())}"
        )
    _check_options(spec)
    if not _tuple_of(spec.collaborators, Collaborator):
        raise TypeError(f"protocol {spec.name}: collaborators is not a tuple of Collaborator")
    if not _tuple_of(spec.flags, Flag):
        raise TypeError(f"protocol {spec.name}: flags is not a tuple of Flag")
    for collaborator in spec.collaborators:
        _check_collaborator(spec, collaborator)
    for flag in spec.flags:
        if not (isinstance(flag.decls, tuple) and flag.decls):
            raise TypeError(f"protocol {spec.name}: flag {flag.key!r} declares no option")
        _check_key(spec, flag.key, flag.decls)


def _check_collaborator(spec: ProtocolSpec, collaborator: Collaborator) -> None:
    c, where = collaborator, f"protocol {spec.name}: collaborator {collaborator.name!r}"
    if not isinstance(c.name, str) or not all(isinstance(v, bool) for v in (c.served, c.many)):
        raise TypeError(f"{where}: its name is not text, or served or many not a bool")
    if not (c.author is None or isinstance(c.author, Author)):
        raise TypeError(f"{where}: its author is not an Author")
    if not callable(c.served_when):
        raise TypeError(f"{where}: served_when is not callable")
    _check_key(spec, c.key, () if c.flag is None else (c.flag,))


def _check_key(spec: ProtocolSpec, key: object, decls: tuple[object, ...]) -> None:
    """Refuse a key that is not the protocol's own (`_check_own`), no config field
    (`option_type` resolves it) or, when the CLI gets an option for it, one click cannot
    parse, declared as no option can be."""
    if not isinstance(key, str):
        raise TypeError(f"protocol {spec.name}: the config key {key!r} is not text")
    _check_own(spec, key)
    kind = option_type(spec, key)
    if not decls:
        return
    for decl in decls:
        if not (isinstance(decl, str) and _DECL.fullmatch(decl)):
            raise ValueError(f"protocol {spec.name}: {decl!r} is not an option (--name or -x)")
    item = typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind
    if item not in _OPTION_SCALARS or (item is bool and kind is not item):
        raise TypeError(f"protocol {spec.name}: {decls[0]} would set protocol.{key}, a {kind}")


def _check_options(spec: ProtocolSpec) -> None:
    """An options class is a dataclass whose every field has a default (a run that sets
    none of them builds it) and a type the config reader knows."""
    from collabrl.config import build_config, field_help

    options = spec.options
    if options is None:
        return
    if not (isinstance(options, type) and is_dataclass(options)):
        raise TypeError(f"protocol {spec.name}: options is not a dataclass class")
    try:
        field_help(options)
        build_config(options, [])
    except Exception as err:  # whatever reading the plugin's class raises is its mistake
        raise TypeError(f"protocol {spec.name}: its options class: {err}") from err


def _tuple_of(value: object, kind: type) -> bool:
    return isinstance(value, tuple) and all(isinstance(item, kind) for item in value)


def _check_own(spec: ProtocolSpec, key: str) -> None:
    """Refuse a key that lies outside the protocol's own options (its `section`, or
    `options.KEY`) and is a section of ProtocolConfig or a field every protocol reads
    (COMMON_FIELDS): a run folder leaves the protocol's own keys out of every other
    protocol's saved config (`protocols/saved.py`), so a resume of one of those would
    lose it. A collaborator's own field (`teacher`) is fine, and may be shared."""
    top = key.split(".")[0]
    if top == spec.section or key.startswith(OPTIONS_PREFIX):
        return
    if top in _sections() or top in COMMON_FIELDS:
        raise ValueError(
            f"protocol {spec.name}: protocol.{key} is not its own; its own keys are "
            "options.KEY (a field of its options class)"
            + (f" or {spec.section}.KEY" if spec.section else "")
        )


def _sections() -> tuple[str, ...]:
    """The sections of ProtocolConfig (relay, consult, …): a spec's `section` is one."""
    hints = typing.get_type_hints(ProtocolConfig)
    return tuple(name for name, kind in hints.items() if is_dataclass(kind))


def option_type(spec: ProtocolSpec, key: str) -> Any:
    """The type of protocol key `key` (dotted under `protocol.`): its ProtocolConfig
    field's, or, for `options.KEY`, its spec's options class field's; None dropped (an
    option not given sets nothing). A ValueError names a key that is no field."""
    if key.startswith(OPTIONS_PREFIX):
        node: Any = spec.options
        path = key.removeprefix(OPTIONS_PREFIX).split(".")
    else:
        node, path = ProtocolConfig, key.split(".")
    for part in path:
        hints = typing.get_type_hints(node) if is_dataclass(node) else {}
        if part not in hints:
            raise ValueError(f"protocol {spec.name}: protocol.{key} is no config field")
        node = hints[part]
    args = [a for a in typing.get_args(node) if a is not type(None)]
    return args[0] if typing.get_origin(node) is not list and len(args) == 1 else node


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
    """Register every installed plugin protocol, once. One that fails to load, whose
    spec is malformed or whose name is taken is skipped with one line on stderr: a broken
    third-party package must not stop the built-in protocols (the unknown-name error
    names it). A Ctrl-C while one imports stays an interrupt."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for name, value, point in _plugin_points():
        try:
            if isinstance(point, Exception):
                raise point
            _register_point(point)
        # A plugin that calls sys.exit at import is broken like one that raises: left to
        # itself, it would end `collab` with its code (0) before the command ran.
        except (Exception, SystemExit) as error:
            _BROKEN[name] = _failure(error)
            print(
                f"collabrl: skipped the protocol plugin '{name}' ({value}): {_BROKEN[name]}",
                file=sys.stderr,
            )


def _register_point(point: EntryPoint) -> ProtocolSpec:
    """Load one entry point to its ProtocolSpec and `register` it: how every protocol is
    registered, a built-in one (`BUILTIN_POINTS`) as an installed plugin's."""
    if not point.pattern.fullmatch(point.value):
        raise ValueError(f"{point.value!r} is not module:attribute")
    spec = point.load()
    if not isinstance(spec, ProtocolSpec):
        raise TypeError(f"{point.value} is a {type(spec).__name__}, not a ProtocolSpec")
    if isinstance(spec.name, str) and spec.name in _SPECS:
        raise ValueError(f"the name {spec.name!r} is taken")
    return register(spec)


def _register_builtins() -> tuple[ProtocolSpec, ...]:
    """Register the built-in protocols, before any plugin. One that fails raises: it is
    a bug of collabrl's, where a broken plugin is a third party's and is skipped."""
    return tuple(_register_point(point) for point in BUILTIN_POINTS)


def _plugin_points() -> list[tuple[str, str, EntryPoint | Exception]]:
    """(name, value, entry point) of every installed protocol plugin. Where a distribution's
    entry points cannot be read (a malformed entry_points.txt, of any package), each
    distribution is read alone, so that the broken one alone is skipped: it is an entry
    of its own, with the error."""
    try:
        return [(p.name, p.value, p) for p in entry_points(group=ENTRY_POINT_GROUP)]
    except Exception:  # the packager's metadata: whatever parsing it raises
        return _points_by_distribution()


def _points_by_distribution() -> list[tuple[str, str, EntryPoint | Exception]]:
    """`_plugin_points`, one distribution at a time, each once (the first on sys.path, as
    `importlib.metadata.entry_points` picks)."""
    found: list[tuple[str, str, EntryPoint | Exception]] = []
    seen: set[str] = set()
    for dist in distributions():
        try:
            name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
            if name in seen:
                continue
            seen.add(name)
            points = dist.entry_points.select(group=ENTRY_POINT_GROUP)
            found += [(point.name, point.value, point) for point in points]
        except Exception as error:  # this distribution's metadata
            found.append((str(getattr(dist, "_path", "a distribution")), "its metadata", error))
    return found


def _failure(error: BaseException) -> str:
    """One line saying why a plugin failed to load."""
    if isinstance(error, SystemExit):
        return f"it exited while loading (SystemExit {error.code!r})"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


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
        raise unknown_name("protocol", name, list(names()), _BROKEN)
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


def pin_collaborators(config: ProtocolConfig) -> None:
    """Pin each hub name among the collaborators `config`'s protocol serves (a teacher, the
    experts) to the commit it loads, as a run's policy is pinned: its saved config then
    names the weights it ran with. Any other reference, or one not cached, stays as it is."""
    from collabrl.models import pin_loaded

    for collaborator in get(config.name).collaborators:
        value = collaborator_value(config, collaborator)
        if value is None or not collaborator.serves(config):
            continue
        refs = [value] if isinstance(value, str) else value
        pinned = [pin_loaded(ref) or ref for ref in refs]
        changed = pinned[0] if isinstance(value, str) else pinned
        if collaborator.key.startswith(OPTIONS_PREFIX):
            config.options[collaborator.key.removeprefix(OPTIONS_PREFIX)] = changed
        else:
            setattr(config, collaborator.key, changed)


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
    for section in dict.fromkeys(s.section for s in specs() if s.section is not None):
        _check_values(getattr(config, section))
    _check_values(read_options(config))
    check_collaborators(config)
    for collaborator in collaborators():
        if collaborator.served:
            for ref in collaborator_refs(config, collaborator):
                stand_in_accuracy(ref)  # `reference@2` is refused here, not at its first call
    spec.check(config)


def _check_values(options: object) -> None:
    """Run an options object's own `check()`, where its class has one (RelayConfig's
    bounds; a plugin's options class may define one the same way)."""
    check = getattr(options, "check", None)
    if callable(check):
        check()


def uses_reference(config: ProtocolConfig) -> bool:
    """Whether a collaborator that this protocol runs is the `reference` stand-in, which
    reads each task's gold answer (outputs must say so)."""
    return get(config.name).uses_reference(config)


BUILTIN: tuple[ProtocolSpec, ...] = _register_builtins()
