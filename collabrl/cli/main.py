"""Entry point of the `collab` command."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from collabrl import __version__
from collabrl.cli import build as build_cli
from collabrl.cli import configs as config_cli
from collabrl.cli import eval as eval_cli
from collabrl.cli import tools as tools_cli
from collabrl.cli import train as train_cli
from collabrl.cli.console import make_console, quiet_library_bars
from collabrl.cli.doctor import doctor
from collabrl.cli.evolve import evolve
from collabrl.cli.filter import filter_data
from collabrl.cli.infer import infer
from collabrl.cli.interrupts import is_interrupt
from collabrl.cli.options import config_command
from collabrl.cli.serve import serve
from collabrl.cli.view import view
from collabrl.errors import UserError

# What a Ctrl-C leaves, by command: the long jobs keep what they finished in their run
# folder (--out) and continue from it when run again.
RESUME_HINTS = {
    **dict.fromkeys(
        ("eval", "build-warmup", "filter"),
        "finished work is saved: re-run the same command with the same --out to resume",
    ),
    **dict.fromkeys(
        ("train", "evolve"),
        "finished work is saved: re-run the same command with --resume and the same --out",
    ),
}

# Words after which a command does no work (a help page, a dry run), so a Ctrl-C kept none.
NO_WORK = frozenset(("--help", "--dry-run"))


# What Typer returns (not standalone) for a Ctrl-C outside a command's invocation; no
# command of ours returns it.
INTERRUPTED_BY_TYPER = 130


class Interrupted(Exception):
    """Ctrl-C during a command, carried past Typer, which turns a KeyboardInterrupt into a
    silent exit 130 before `main` could say what was kept."""

    def __init__(self, command: str | None) -> None:
        super().__init__(command)
        self.command = command


class _Root(TyperGroup):
    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BaseException as err:
            if not is_interrupt(err):
                raise
            raise Interrupted(ctx.invoked_subcommand) from err


app = typer.Typer(
    cls=_Root,
    name="collab",
    help="Multi-model collaborative reasoning: train and evaluate policies that call on "
    "experts, teachers, planners and tools.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
app.add_typer(eval_cli.app, name="eval")
app.add_typer(config_cli.app, name="config")
app.add_typer(build_cli.app, name="build-warmup")
app.add_typer(train_cli.app, name="train")
app.add_typer(tools_cli.app, name="tools")
app.command("serve", cls=config_command("serve"))(serve)
app.command("infer", cls=config_command("infer"))(infer)
app.command("filter", cls=config_command("filter"))(filter_data)
app.command("evolve", cls=config_command("evolve"))(evolve)
app.command("view")(view)
app.command("doctor")(doctor)
console = make_console()
err_console = make_console(stderr=True)


def _version(value: bool) -> None:
    if value:
        console.print(f"collab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """collabrl command line."""


@app.command()
def benchmarks() -> None:
    """List the registered benchmarks (any .jsonl/.parquet file works too)."""
    from collabrl.data.benchmarks import load_benchmark, registry

    table = Table("name", "problems", "prompt", "description")
    for spec in registry().values():
        count = len(load_benchmark(spec.name).items)  # counted as the loader reads rows
        table.add_row(spec.name, str(count), spec.prompt, spec.description)
    console.print(table)


@app.command()
def models() -> None:
    """List the embedded models (and whether their converted weights are cached) and the
    models of the local Hugging Face cache, with their revisions and size."""
    from rich.filesize import decimal

    from collabrl.models import EMBEDDED_MODELS, cache_home, cached_models, hf_hub_cache

    table = Table("name", "package", "cached", "description", title="embedded")
    for model in EMBEDDED_MODELS.values():
        cached = (cache_home() / "models" / model.name / "config.json").is_file()
        table.add_row(model.name, model.pip_name, "yes" if cached else "no", model.description)
    console.print(table)
    cache = hf_hub_cache()
    hub = Table("name", "revisions (--revision)", "size", title="Hugging Face cache")
    for cached_model in cached_models(cache):
        revisions = [" = ".join([*refs, commit]) for commit, refs in cached_model.snapshots.items()]
        shown = escape("\n".join(revisions)) or "no snapshot"  # folder names: no markup
        if cached_model.problem:
            shown = f"[red]damaged: {escape(cached_model.problem)}[/]"
        hub.add_row(escape(cached_model.name), shown, decimal(cached_model.size))
    if hub.rows:
        console.print(hub)
    # On a line of its own, unwrapped: a path a user copies.
    where = f"Hugging Face cache {cache} (HF_HUB_CACHE, else HF_HOME/hub)"
    console.print(where if hub.rows else f"{where}: no models", soft_wrap=True, highlight=False)
    console.print(
        "Also accepted: a Hugging Face model folder, a .gguf file, a LoRA adapter folder, a "
        "hub name in the cache (org/name, --revision or @REVISION for another snapshot), "
        "or an OpenAI-compatible base URL (http://host:port/v1)."
    )


def main() -> None:
    """Run the CLI; user errors become one line on stderr and a non-zero exit."""
    quiet_library_bars(sys.stdout, sys.stderr)  # before any command imports transformers
    try:
        code = app(standalone_mode=False)
    except UserError as err:
        _fail(str(err), 2)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except Interrupted as err:
        hint = None if NO_WORK.intersection(sys.argv[1:]) else RESUME_HINTS.get(err.command or "")
        _fail(f"interrupted; {hint}" if hint else "interrupted", 130)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)  # before or after any command ran
    except Exception as err:
        if is_interrupt(err):
            _fail("interrupted", 130)  # a Ctrl-C wrapped by whatever it landed in
        if type(err).__name__ == "NoArgsIsHelpError":
            sys.exit(0)  # the help text was already printed
        if not _is_usage_error(err):
            raise
        ctx = getattr(err, "ctx", None)
        hint = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
        _fail(f"{err.format_message()}{hint}", err.exit_code)
    if code == INTERRUPTED_BY_TYPER:
        _fail("interrupted", 130)  # while the options were read (`--version`, its callback)
    sys.exit(code if isinstance(code, int) else 0)


def _is_usage_error(err: Exception) -> bool:
    """Click-style parse errors (Typer vendors click, so match by shape, not class)."""
    return hasattr(err, "format_message") and isinstance(getattr(err, "exit_code", None), int)


def _fail(message: str, code: int) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
