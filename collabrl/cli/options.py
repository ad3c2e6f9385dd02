"""Options shared by the commands, each tied to the config key it sets.

An option declared with `config_option("sampling.n", "--n")` shows that config field's own
help string in `--help` (so options, `collab config show` and configs never drift apart),
and its value lands at that key in the command-line config layer. The help strings are
looked up only when help is printed: the config classes of `eval` and `infer` import the
protocols (torch, openai), which no other `collab` call should wait for.

The protocol options (`--teacher`, `--expert`, `--self-collab`, a plugin's `--echo`, …)
are not written here: a command whose config has a `protocol` section builds them from
the protocol registry (each spec's collaborators and flags) when it runs or prints help,
so a protocol registered by a plugin gets its options with no change here.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand

from collabrl.errors import UserError

if TYPE_CHECKING:
    from collabrl.protocols.spec import ProtocolSpec
    from collabrl.train.methods.spec import MethodSpec

# The prefix of a training method's command: `collab train NAME` is `train-NAME`.
TRAIN = "train-"


def method_of(command: str) -> MethodSpec[Any] | None:
    """The registered training method whose command `command` is (`train-NAME`), or None."""
    if not command.startswith(TRAIN):
        return None
    from collabrl.train.methods import registry as methods

    return methods.find(command.removeprefix(TRAIN))


class _WithMethods(Mapping[str, str]):
    """Command -> a value: the fixed commands', then `train-NAME` of every registered
    training method (a plugin's included), `of_method` of its spec, read when asked: a
    method registered after this module loaded has its command all the same."""

    def __init__(self, fixed: dict[str, str], of_method: Callable[[Any], str]) -> None:
        self.fixed, self.of_method = fixed, of_method

    def _all(self) -> dict[str, str]:
        from collabrl.train.methods import registry as methods

        found = {f"{TRAIN}{spec.name}": self.of_method(spec) for spec in methods.specs()}
        return {**self.fixed, **found}

    def __getitem__(self, command: str) -> str:
        return self._all()[command]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


# The config class of each command that has one, as "module:Class" (imported on demand);
# a training method's is its spec's.
FIXED_CONFIG_CLASSES = {
    "eval": "collabrl.eval.config:EvalConfig",
    "infer": "collabrl.protocols.infer:InferConfig",
    "serve": "collabrl.serve.config:ServeConfig",
    "build-warmup-relay": "collabrl.builders.relay_warmup:RelayWarmupConfig",
    "build-warmup-rsim": "collabrl.builders.rsim_warmup:RsimWarmupConfig",
    "build-warmup-consult": "collabrl.builders.consult_warmup:ConsultWarmupConfig",
    "build-warmup-apollo": "collabrl.builders.apollo_warmup:ApolloWarmupConfig",
    "filter": "collabrl.builders.filter:FilterConfig",
    "evolve": "collabrl.evolve.config:EvolveConfig",
}
CONFIG_CLASSES: Mapping[str, str] = _WithMethods(FIXED_CONFIG_CLASSES, lambda spec: spec.config)


def protocol_offer(command: str) -> str | None:
    """Whose protocol options `command` offers: every registered protocol's (infer,
    eval), those a GRPO method may roll out on (`grpo`: its spec's `any_grpo_protocol`,
    then each protocol's `spec.grpo`), its method's own protocol's (`method`), or none."""
    if command in ("infer", "eval"):
        return "every"
    method = method_of(command)
    if method is None or not method.grpo:
        return None
    return "grpo" if method.any_grpo_protocol else "method"


def fixed_keys(command: str) -> dict[str, str]:
    """What a command sets whatever its config file says: `collab train relay` is the
    relay method's run."""
    method = method_of(command)
    return {"method": method.name} if method is not None and method.grpo else {}


# A config-bound parameter carries its key in its help text until help is printed.
_KEY_MARK = "config-key:"


def config_option(key: str, *decls: str) -> Any:
    """An option that sets config key `key` (dotted); None when not given."""
    return typer.Option(None, *decls, help=_KEY_MARK + key, show_default=False)


def config_flag(key: str, name: str) -> Any:
    """A boolean option that sets config key `key`: `--name` true, `--no-name` false (a
    config file's true turned off on the command line); None when neither is given."""
    return config_option(key, f"{name}/--no-{name.removeprefix('--')}")


def renamed_option(key: str, old: str) -> Any:
    """A flag's old name, hidden from --help, still setting `key`; the command calls
    `note_renamed` with its value (read until the release `RENAMED_UNTIL` names)."""
    return typer.Option(None, old, help=_KEY_MARK + key, show_default=False, hidden=True)


def note_renamed(old: str, new: str, value: Any) -> None:
    """The note an old flag name prints when it was given."""
    from collabrl.config import RENAMED_UNTIL

    if value is not None:
        print(
            f"note: {old} is now {new}; the old name is read until collabrl {RENAMED_UNTIL}",
            file=sys.stderr,
        )


def config_argument(key: str, required: bool = False) -> Any:
    """A positional argument that sets config key `key`."""
    return typer.Argument(... if required else None, help=_KEY_MARK + key, show_default=False)


# Options every command with a config has.
CONFIG = typer.Option(
    None, "--config", "-c", help="YAML config file (its keys: `collab config show COMMAND`)."
)
SET = typer.Option(
    None, "--set", help="Override any config key, last of all: key.sub=value (repeatable)."
)

# Options of the commands whose config has `model`, `engine` and `protocol` (eval, infer).
MODEL = config_option("model", "--model", "-m")
ENGINE = config_option("engine.kind", "--engine")
DEVICE = config_option("engine.device", "--device")
BATCH_SIZE = config_option("engine.batch_size", "--batch-size")
API_KEY = config_option("engine.api_key", "--api-key")
PROTOCOL_KEY = "protocol.name"
PROTOCOL = config_option(PROTOCOL_KEY, "--protocol", "-p")
TOKENIZER = config_option("protocol.tokenizer", "--tokenizer")
# After each option's own name, the names users already type for it: lm-eval's and
# Hugging Face's (`max_new_tokens`), TRL's (`max_completion_length`, `output_dir`, …).
MAX_TOKENS = config_option(
    "sampling.max_tokens", "--max-tokens", "--max-new-tokens", "--max-completion-length"
)
OUT = config_option("out", "--out", "--output-dir", "--output-path")
TEMPERATURE = config_option("sampling.temperature", "--temperature")
TOP_P = config_option("sampling.top_p", "--top-p")
SEED = config_option("sampling.seed", "--seed")
PROMPT = config_option("prompt", "--prompt")


# The config key of the model each command loads, which `--revision` applies to (`collab
# filter` loads its teacher; evolve's several models take `org/name@REVISION` each).
REVISION_KEYS: Mapping[str, str] = _WithMethods(
    {
        **{command: "model" for command in FIXED_CONFIG_CLASSES if command != "evolve"},
        "filter": "teacher",
    },
    lambda spec: "model",
)
# Every other command's config reaches a run folder (config.yaml, results.json, the model
# card): a hub name there is pinned to the commit it loads. `collab serve` saves none,
# and answers to the model name it was given.
UNPINNED = frozenset({"serve"})
# Config keys that list models a command loads, each pinned as the model is.
PINNED_LISTS: Mapping[str, tuple[str, ...]] = {"evolve": ("models", "verifiers")}


@functools.cache
def revision_param(command: str) -> Any:
    """`--revision` of `command`, built once: click matches a parsed option to its
    parameter by identity. Its value goes to ctx.meta (`_keep`), where `resolve` reads it."""
    flag = "--teacher" if REVISION_KEYS[command] == "teacher" else "--model"
    declared = typer.Option(
        None,
        "--revision",
        help=f"The revision of a hub name (org/name) given as {flag}: a branch, tag or "
        "commit, as from_pretrained takes it, read from the local Hugging Face cache "
        f"(the same as {flag} ORG/NAME@REVISION). A run saves the commit it loaded.",
        show_default=False,
        expose_value=False,
        callback=_keep,
    )

    def command_of_options(revision: str | None = declared) -> None:
        """Never run: Typer builds the option from this signature."""

    builder = typer.Typer(add_completion=False)
    builder.command()(command_of_options)
    return typer.main.get_command(builder).params[0]


def config_command(command: str) -> type[TyperCommand]:
    """The command class for `command`: its config-bound parameters get their help from
    the fields of `CONFIG_CLASSES[command]`."""
    name = command.title().replace("-", "")
    return type(f"{name}Command", (_ConfigCommand,), {"config_class": command})


class _ConfigCommand(TyperCommand):
    config_class = ""  # a key of CONFIG_CLASSES, set by `config_command`
    # The protocol options last built, and the registered protocols they were built for.
    _protocol_params: tuple[tuple[str, ...], list[Any]] = ((), [])

    def get_params(self, ctx: typer.Context) -> list[Any]:
        """The command's own parameters, with the protocol options after `--model`.

        Built on the first parse or help, so that other commands never import the registry;
        kept while the registered protocols stay the same, since click matches a parsed
        option to its parameter by identity."""
        params = super().get_params(ctx)
        if self.config_class in REVISION_KEYS:  # `--revision` after the option it applies to
            names = [p.name for p in params]
            key = REVISION_KEYS[self.config_class]
            at = names.index(key) + 1 if key in names else len(params)
            params = [*params[:at], revision_param(self.config_class), *params[at:]]
        if protocol_offer(self.config_class) is None:
            return params
        from collabrl.protocols import registry

        built_for, built = self._protocol_params
        if built_for != registry.names():
            taken = {decl for p in params for decl in (*p.opts, *p.secondary_opts)}
            built = protocol_params(self.config_class, taken)
            self._protocol_params = (registry.names(), built)
        names = [p.name for p in params]
        at = names.index("model") + 1 if "model" in names else len(self.params)
        return [*params[:at], *built, *params[at:]]

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        from collabrl.config import inline_yaml

        helps = config_helps(self.config_class)
        defaults = config_defaults(self.config_class)
        for param in self.get_params(ctx):
            key = config_key(param)
            if key is None:
                continue
            # This process only prints help, then exits: the parameters are rewritten.
            if key == PROTOCOL_KEY:  # every registered protocol, with its spec's line
                from collabrl.protocols.registry import protocol_help

                param.help = protocol_help()
            else:
                param.help = helps[key]
            # The option's own default is None (not given); the config's is what it sets
            # then. An argument's is left out: a required one's would mislead.
            if _shown_default(defaults.get(key)) and param.param_type_name == "option":
                param.default, param.show_default = inline_yaml(defaults[key]), True
                if param.secondary_opts:  # `--lora/--no-lora`: the flag is shown, `no-lora`
                    param.default = defaults[key]
        super().format_help(ctx, formatter)


def config_helps(command: str) -> dict[str, str]:
    """Dotted key -> help of `command`'s config, with the fields of every registered
    protocol's options class (`protocol.options.KEY`) where the config has a protocol."""
    from collabrl.config import field_help

    return _with_protocol_options(command, field_help(load_config_class(command)), field_help)


def config_defaults(command: str) -> dict[str, Any]:
    """Dotted key -> value of `command`'s config when nothing is given, as `collab config
    show COMMAND` prints it (`fixed_keys` applied), with the defaults of every registered
    protocol's options class (`protocol.options.KEY`) where the config has a protocol."""
    from collabrl.config import build_config

    values = _dotted_values(load_config(command, None, {}, []))
    return _with_protocol_options(
        command, values, lambda options: _dotted_values(build_config(options, []))
    )


def _with_protocol_options(
    command: str, by_key: dict[str, Any], of_options: Callable[[type], dict[str, Any]]
) -> dict[str, Any]:
    """`by_key` (dotted key -> what is known of it) and, where `command`'s config has a
    protocol, `of_options` of every registered protocol's options class under
    `protocol.options.KEY`; a key the config itself has keeps its own entry."""
    if protocol_offer(command) is None:
        return by_key
    from collabrl.protocols import registry

    for spec in (s for s in registry.specs() if s.options is not None):
        own = {f"protocol.options.{k}": v for k, v in of_options(spec.options).items()}
        by_key |= {k: v for k, v in own.items() if k not in by_key}
    return by_key


def _shown_default(value: Any) -> bool:
    """Whether `--help` shows a config default: not for None or an empty list or mapping
    (nothing is set then, as when the option is not given)."""
    return value is not None and value not in ([], {})


def _dotted_values(config: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every field of dataclass `config`, its sections' included."""
    values: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if is_dataclass(value):
            values |= _dotted_values(value, f"{prefix}{f.name}.")
        else:
            values[prefix + f.name] = value
    return values


def offered_protocols(command: str) -> list[ProtocolSpec]:
    """The protocols whose collaborators and flags `command` offers (`protocol_offer`)."""
    from collabrl.protocols import registry

    which = protocol_offer(command)
    method = method_of(command)
    if which == "method" and method is not None and method.protocol is not None:
        return [registry.get(method.protocol)]
    return [spec for spec in registry.specs() if which == "every" or spec.grpo]


def protocol_flags(command: str) -> dict[str, tuple[tuple[str, ...], ProtocolSpec]]:
    """Protocol key -> (its option's declarations, the spec that declares it), for every
    collaborator with a flag and every flag of the protocols `command` offers."""
    offered = declared_flags(offered_protocols(command))
    method = method_of(command)
    for key in () if method is None else method.not_offered:
        offered.pop(key, None)
    return offered


def declared_flags(specs: list[ProtocolSpec]) -> dict[str, tuple[tuple[str, ...], ProtocolSpec]]:
    """Protocol key -> (declarations, declaring spec) of `specs`' collaborators and flags;
    a key two protocols share is one option, as the first declares it."""
    declared: dict[str, tuple[tuple[str, ...], ProtocolSpec]] = {}
    for spec in specs:
        for collaborator in spec.collaborators:
            if collaborator.flag is not None:
                declared.setdefault(collaborator.key, ((collaborator.flag,), spec))
        for flag in spec.flags:
            declared.setdefault(flag.key, (flag.decls, spec))
    return declared


def protocol_params(command: str, taken: set[str]) -> list[Any]:
    """The click options of `command`'s protocol flags, typed by their config fields (bool:
    a flag, list: repeatable). A flag that a command option already has is left out: a
    plugin cannot take `--model` over."""
    from collabrl.protocols import registry

    keyword = inspect.Parameter.KEYWORD_ONLY
    signature = []
    for key, (decls, spec) in protocol_flags(command).items():
        if taken.intersection(decls):
            continue
        taken.update(decls)
        kind = registry.option_type(spec, key)
        if kind is bool and "/" not in decls[0]:  # `--no-self-collab`: a file's true, off
            decls = (f"{decls[0]}/--no-{decls[0].removeprefix('--')}", *decls[1:])
        # Typer's callback wrapper takes only the command function's own parameters: the
        # value goes to ctx.meta (`_keep`), where `cli_layer` and `check` read it.
        declared = typer.Option(
            None,
            *decls,
            help=_KEY_MARK + f"protocol.{key}",
            show_default=False,
            expose_value=False,
            callback=_keep,
        )
        signature.append(
            inspect.Parameter(_param_name(key), keyword, default=declared, annotation=kind)
        )

    def command_of_options() -> None:
        """Never run: Typer builds its options from this signature."""

    command_of_options.__signature__ = inspect.Signature(signature)  # type: ignore[attr-defined]
    builder = typer.Typer(add_completion=False)
    builder.command()(command_of_options)
    return list(typer.main.get_command(builder).params)


def _param_name(key: str) -> str:
    """The parameter name of protocol key `key`, apart from every command option's."""
    return "protocol_" + key.replace(".", "_")


def _keep(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """Keep a protocol option's value where `option_values` finds it."""
    ctx.meta.setdefault(_PROTOCOL_VALUES, {})[param.name] = value
    return value


_PROTOCOL_VALUES = "collabrl.protocol_options"


def option_values(ctx: typer.Context) -> dict[str, Any]:
    """Parameter name -> value of every option given or defaulted: the command function's
    and the protocol options'."""
    return {**ctx.meta.get(_PROTOCOL_VALUES, {}), **ctx.params}


def load_config_class(command: str) -> type:
    module, _, name = CONFIG_CLASSES[command].partition(":")
    return getattr(importlib.import_module(module), name)


def config_key(param: Any) -> str | None:
    """The config key a parameter sets, or None for one that sets none (e.g. `--json`)."""
    text = getattr(param, "help", None) or ""
    return text.removeprefix(_KEY_MARK) if text.startswith(_KEY_MARK) else None


def cli_layer(ctx: typer.Context) -> dict[str, Any]:
    """The config layer of the config-bound options given on the command line."""
    layer: dict[str, Any] = {}
    values = option_values(ctx)
    for param in ctx.command.get_params(ctx):
        key, value = config_key(param), values.get(param.name or "")
        if key is None or not _given(value):
            continue
        *sections, leaf = key.split(".")
        node = layer
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = list(value) if isinstance(value, tuple | list) else value
    return layer


def resolve(ctx: typer.Context, config: Path | None, sets: list[str] | None) -> Any:
    """The running command's config: defaults < `--config` file < options < `--set`; then
    `--revision` applied to its model, and a hub name pinned to its commit (except
    `UNPINNED`'s)."""
    command = ctx.command.config_class
    resolved = load_config(command, config, cli_layer(ctx), sets)
    if command in REVISION_KEYS:
        key = REVISION_KEYS[command]
        from collabrl.models import at_revision, pin_loaded

        ref = at_revision(getattr(resolved, key), option_values(ctx).get("revision"), key)
        setattr(resolved, key, ref if command in UNPINNED else pin_loaded(ref))
    if PINNED_LISTS.get(command):
        from collabrl.models import pin_loaded

        for key in PINNED_LISTS[command]:
            setattr(resolved, key, [pin_loaded(ref) or ref for ref in getattr(resolved, key)])
    from collabrl.protocols.config import ProtocolConfig

    protocol = getattr(resolved, "protocol", None)
    # A config's protocol *field* holds its teacher and experts; a protocol() method
    # (apollo's warm-up builds one from its tools) names no collaborator to pin.
    if command not in UNPINNED and isinstance(protocol, ProtocolConfig):
        from collabrl.protocols.registry import pin_collaborators

        pin_collaborators(protocol)
    return resolved


def load_config(
    command: str, config: Path | None, layer: dict[str, Any], sets: list[str] | None
) -> Any:
    """`command`'s config from a `--config` file (a path, or a shipped config's name), an
    options layer and `--set` strings."""
    from collabrl.config import build_config, check_sections, config_file, read_yaml

    cls = load_config_class(command)
    layers = []
    if config is not None:
        config = config_file(config)
        layers.append(read_yaml(config))
        check_sections(cls, config)
    fixed = fixed_keys(command)
    given = {**(layers[0] if layers else {}), **_set_values(sets or [])}
    for key, value in fixed.items():
        if str(given.get(key, value)) != value:
            name = command.replace("-", " ")
            raise UserError(
                f"the config sets {key} {given[key]}, but this is collab {name}",
                f"drop {key} from the config, or run the command it names",
            )
    return build_config(cls, [*layers, layer, fixed], sets or [])


def _set_values(sets: list[str]) -> dict[str, str]:
    """The top-level keys `--set key=value` strings give, with their raw values."""
    pairs = (assignment.partition("=") for assignment in sets)
    return {key.strip(): value for key, sep, value in pairs if sep and "." not in key}


def check(ctx: typer.Context, *checks: Callable[[], Any]) -> Any:
    """Run config checks and return what the last returns (a resolved run); an error
    about a key that a given option set names the option, and a fix naming a protocol
    flag this command lacks names its `--set` instead."""
    try:
        result = None
        for run_check in checks:
            result = run_check()
        return result
    except UserError as err:
        params = ctx.command.get_params(ctx)
        fix = command_fix(err.fix, _option_names(params), getattr(ctx.command, "config_class", ""))
        key, values = err.problem.split(" ", 1)[0], option_values(ctx)
        given = [p for p in params if config_key(p) == key and _given(values.get(p.name))]
        # Typer vendors click, so an option is known by its shape, not its class.
        if given and getattr(given[0], "param_type_name", None) == "option":
            raise type(err)(f"{given[0].opts[0]}: {err.problem}", fix) from err
        if fix == err.fix:
            raise  # the value came from --config or --set, which the message's key names
        raise type(err)(err.problem, fix) from err


def _option_names(params: list[Any]) -> set[str]:
    """Every option name of `params` (`--self-collab`, `-m`, a flag's `--no-…`)."""
    return {decl for p in params for decl in (*p.opts, *p.secondary_opts)}


# A `--flag` in an error's fix, with the word after it (its value, when it takes one).
_FLAG_IN_FIX = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)((?:[ =])[^\s,;]+)?")


def command_fix(fix: str | None, options: set[str], command: str) -> str | None:
    """`fix` for a command with `options`: a protocol flag it lacks (`collab train rsim` has
    no --planner-kind; `collab config show` none at all) becomes `--set protocol.KEY=VALUE`,
    which every command whose config has a protocol section takes. Protocol checks name
    their flags (a spec's check does not know which command runs it)."""
    if not fix or command not in CONFIG_CLASSES:
        return fix
    if "protocol" not in {f.name for f in fields(load_config_class(command))}:
        return fix  # `collab filter`'s --teacher is its own, at its config's top level
    from collabrl.protocols import registry

    by_flag = {
        decl: (key, spec)
        for key, (decls, spec) in declared_flags(list(registry.specs())).items()
        for decl in decls
    }

    def to_set(match: re.Match[str]) -> str:
        flag, value = match.group(1), match.group(2) or ""
        if flag not in by_flag or flag in options:
            return match.group(0)
        key, spec = by_flag[flag]
        kind = registry.option_type(spec, key)
        if kind is bool:  # a flag: the word after it is the fix's own
            return f"--set protocol.{key}=true{value}"
        if typing.get_origin(kind) is list:
            return f"--set protocol.{key}=[{value[1:]}]"
        return f"--set protocol.{key}={value[1:]}"

    return _FLAG_IN_FIX.sub(to_set, fix)


def _given(value: Any) -> bool:
    """Whether an option was given: None is its default, () a repeatable one not repeated."""
    return value is not None and value not in ((), [])
