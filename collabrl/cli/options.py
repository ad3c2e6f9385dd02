"""Options shared by the commands, each tied to the config key it sets.

An option declared with `config_option("sampling.n", "--n")` shows that config field's own
help string in `--help` (so options, `collab config show` and configs never drift apart),
and its value lands at that key in the command-line config layer. The help strings are
looked up only when help is printed: the config classes of `eval` and `infer` import the
protocols (torch, openai), which no other `collab` call should wait for.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from collabrl.errors import UserError

# The config class of each command that has one, as "module:Class" (imported on demand).
CONFIG_CLASSES = {
    "eval": "collabrl.eval.config:EvalConfig",
    "infer": "collabrl.protocols.infer:InferConfig",
    "serve": "collabrl.serve.config:ServeConfig",
    "build-warmup-relay": "collabrl.builders.relay_warmup:RelayWarmupConfig",
    "build-warmup-rsim": "collabrl.builders.rsim_warmup:RsimWarmupConfig",
    "build-warmup-consult": "collabrl.builders.consult_warmup:ConsultWarmupConfig",
    "build-warmup-apollo": "collabrl.builders.apollo_warmup:ApolloWarmupConfig",
    "filter": "collabrl.builders.filter:FilterConfig",
    "train-sft": "collabrl.train.sft:SFTTrainConfig",
    "train-grpo": "collabrl.train.grpo_config:GRPOTrainConfig",
    "train-relay": "collabrl.train.grpo_config:GRPOTrainConfig",
    "train-eapo": "collabrl.train.grpo_config:GRPOTrainConfig",
    "train-rsim": "collabrl.train.grpo_config:GRPOTrainConfig",
    "evolve": "collabrl.evolve.config:EvolveConfig",
}

# What a command sets whatever its config file says: `collab train relay` is the relay
# method's run.
FIXED_KEYS = {f"train-{method}": {"method": method} for method in ("grpo", "relay", "eapo", "rsim")}

# A config-bound parameter carries its key in its help text until help is printed.
_KEY_MARK = "config-key:"


def config_option(key: str, *decls: str) -> Any:
    """An option that sets config key `key` (dotted); None when not given."""
    return typer.Option(None, *decls, help=_KEY_MARK + key, show_default=False)


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
TEACHER = config_option("protocol.teacher", "--teacher")
EXPERT = config_option("protocol.experts", "--expert")
EXPERT_MAX_TOKENS = config_option("protocol.consult.expert_max_tokens", "--expert-max-tokens")
SELF_COLLAB = config_option("protocol.consult.self_collab", "--self-collab")
PLANNER = config_option("protocol.planner", "--planner")
PLANNER_KIND = config_option("protocol.strategy.planner_kind", "--planner-kind")
TOKENIZER = config_option("protocol.tokenizer", "--tokenizer")
MAX_TOKENS = config_option("sampling.max_tokens", "--max-tokens")
TEMPERATURE = config_option("sampling.temperature", "--temperature")
TOP_P = config_option("sampling.top_p", "--top-p")
SEED = config_option("sampling.seed", "--seed")
PROMPT = config_option("prompt", "--prompt")


def config_command(command: str) -> type[TyperCommand]:
    """The command class for `command`: its config-bound parameters get their help from
    the fields of `CONFIG_CLASSES[command]`."""
    name = command.title().replace("-", "")
    return type(f"{name}Command", (_ConfigCommand,), {"config_class": command})


class _ConfigCommand(TyperCommand):
    config_class = ""  # a key of CONFIG_CLASSES, set by `config_command`

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        from collabrl.config import field_help

        helps = field_help(load_config_class(self.config_class))
        for param in self.params:
            key = config_key(param)
            if key == PROTOCOL_KEY:  # every registered protocol, with its spec's line
                from collabrl.protocols.registry import protocol_help

                param.help = protocol_help()
            elif key is not None:
                param.help = helps[key]  # this process only prints help, then exits
        super().format_help(ctx, formatter)


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
    for param in ctx.command.params:
        key, value = config_key(param), ctx.params.get(param.name or "")
        if key is None or not _given(value):
            continue
        *sections, leaf = key.split(".")
        node = layer
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = list(value) if isinstance(value, tuple | list) else value
    return layer


def resolve(ctx: typer.Context, config: Path | None, sets: list[str] | None) -> Any:
    """The running command's config: defaults < `--config` file < options < `--set`."""
    return load_config(ctx.command.config_class, config, cli_layer(ctx), sets)


def load_config(
    command: str, config: Path | None, layer: dict[str, Any], sets: list[str] | None
) -> Any:
    """`command`'s config from a `--config` file, an options layer and `--set` strings."""
    from collabrl.config import build_config, check_sections, read_yaml

    cls = load_config_class(command)
    layers = []
    if config is not None:
        layers.append(read_yaml(config))
        check_sections(cls, config)
    fixed = FIXED_KEYS.get(command, {})
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


def check(ctx: typer.Context, *checks: Callable[[], None]) -> None:
    """Run config checks; an error about a key that a given option set names the option."""
    try:
        for run_check in checks:
            run_check()
    except UserError as err:
        key = err.problem.split(" ", 1)[0]
        given = [
            p for p in ctx.command.params if config_key(p) == key and _given(ctx.params.get(p.name))
        ]
        # Typer vendors click, so an option is known by its shape, not its class.
        if not given or getattr(given[0], "param_type_name", None) != "option":
            raise  # the value came from --config or --set, which the message's key names
        raise UserError(f"{given[0].opts[0]}: {err.problem}", err.fix) from err


def _given(value: Any) -> bool:
    """Whether an option was given: None is its default, () a repeatable one not repeated."""
    return value is not None and value not in ((), [])
