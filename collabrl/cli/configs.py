"""`collab config show COMMAND`: a command's resolved config, every field with its help;
`collab config list`: the configs that ship with collabrl, which `-c NAME` reads."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from collabrl.cli import options as opt

app = typer.Typer(help="Inspect the configs of the commands.", no_args_is_help=True)


@app.command("show")
def show(
    command: str = typer.Argument(..., help=f"{', '.join(opt.CONFIG_CLASSES)}."),
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    """Print COMMAND's config after --config and --set, as YAML with each field's help,
    checked as the command checks it: a value the command would refuse is refused here.

    The output is itself a valid --config file.
    """
    from collabrl.config import describe_config
    from collabrl.errors import MissingInput, UserError

    if command not in opt.CONFIG_CLASSES:
        raise UserError(f"no config for '{command}'", f"use one of {', '.join(opt.CONFIG_CLASSES)}")
    resolved = opt.load_config(command, config, {}, set_)
    try:
        _command_check(command, resolved)()
    except UserError as err:  # a protocol flag it names is a `--set` here
        fix = opt.command_fix(err.fix, {"--config", "-c", "--set"}, command)
        if not isinstance(err, MissingInput):
            raise UserError(err.problem, fix) from err
        # Shown all the same: the run adds the value on its command line.
        print(f"note: {MissingInput(err.problem, fix)}", file=sys.stderr)
    warnings = getattr(resolved, "warnings", None)  # what the command warns of as it starts
    for warning in warnings() if warnings else []:
        print(f"warning: {warning}", file=sys.stderr)
    print(describe_config(resolved, _expanded(resolved)), end="")


@app.command("list")
def list_configs() -> None:
    """List the shipped configs: `-c NAME` reads one from any folder (a file of that path
    wins); `collab config show COMMAND -c NAME` prints it resolved."""
    from rich.table import Table

    from collabrl.cli.console import make_console
    from collabrl.config import configs_dir, shipped_configs

    console = make_console()
    table = Table("name", "for", "about")
    for shipped in shipped_configs():
        table.add_row(shipped.name, shipped.command, shipped.about)
    console.print(table)
    console.print(
        f"Shipped in {configs_dir()}. Use as `-c NAME` (e.g. `collab eval run math500 -c "
        "eval/greedy-pass1`); accelerate's by path: `accelerate launch --config_file "
        f"{configs_dir() / 'accelerate' / 'NAME.yaml'}`.",
        highlight=False,
        soft_wrap=True,
    )


def _command_check(command: str, config: Any) -> Callable[[], None]:
    """What `command` checks its config with before anything loads: a GRPO-based training
    run's also needs the trainer side (its TRL arguments), which `collab train` checks
    first too."""
    method = opt.method_of(command)
    if method is None or not method.grpo:
        return config.check
    from collabrl.train.grpo_args import check_run
    from collabrl.train.resolve import resolve_run

    def check() -> None:
        resolve_run(config)  # the checks that need the rollout protocol
        check_run(config)

    return check


def _expanded(config: object) -> dict[str, object]:
    """The sections `describe_config` shows in place of a raw mapping: the running
    protocol's own options (a plugin's options class) with their defaults and help."""
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.protocols.registry import read_options

    protocol = getattr(config, "protocol", None)
    if not isinstance(protocol, ProtocolConfig):  # a command without a protocol section
        return {}
    options = read_options(protocol)
    return {} if options is None else {"protocol.options": options}
