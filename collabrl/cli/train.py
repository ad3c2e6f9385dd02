"""`collab train sft|grpo|relay|eapo|rsim`: train a policy; the trainers live in
`collabrl.train`.

`sft` has a command of its own. Every method trained by GRPO (a plugin's too) gets its
command from its spec (`collabrl/train/methods/`) when `collab train` is parsed or its
help printed: the shared options, the method's own, and one body (`_train`).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from typer.core import TyperGroup

from collabrl.cli import options as opt
from collabrl.cli.cautions import print_warnings
from collabrl.cli.console import make_console
from collabrl.cli.progress import progress_bar
from collabrl.train.methods.sft import SPEC as SFT

if TYPE_CHECKING:
    import click

    from collabrl.train.methods.spec import MethodSpec
    from collabrl.train.resolve import ResolvedRun

console = make_console()


class _MethodGroup(TyperGroup):
    """`collab train`'s commands: its own (sft, rollouts) and one of every registered
    method trained by GRPO, built from its spec when first asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The commands built for this parse, as Typer builds its own: afresh each time.
        self._built: dict[str, tuple[MethodSpec[Any], click.Command]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        from collabrl.train.methods import registry as methods

        names = methods.names()  # sft among them, first
        return [*names, *(n for n in super().list_commands(ctx) if n not in names)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            return found
        from collabrl.train.methods import registry as methods

        spec = methods.find(cmd_name)
        if spec is None or not spec.grpo:
            return None
        # Once per parse: click matches a parsed option to its parameter by identity.
        built = self._built.get(cmd_name)
        if built is None or built[0] is not spec:
            built = (spec, _method_click_command(spec))
            self._built[cmd_name] = built
        return built[1]


app = typer.Typer(
    cls=_MethodGroup,
    help="Train a policy: sft (warm-up), grpo, relay (RelayLLM), eapo (EAPO), rsim (rSIM), "
    "or a registered method.",
    no_args_is_help=True,
)


@app.command("sft", cls=opt.config_command("train-sft"), help=SFT.help)
def sft(
    ctx: typer.Context,
    model: str = opt.MODEL,
    data: str = opt.config_option("data", "--data"),
    out: str = opt.OUT,
    lora: bool = opt.config_flag("lora.enabled", "--lora"),
    epochs: float = opt.config_option("epochs", "--epochs"),
    learning_rate: float = opt.config_option("learning_rate", "--learning-rate", "--lr"),
    batch_size: int = opt.config_option("batch_size", "--batch-size"),
    seed: int = opt.config_option("seed", "--seed"),
    resume: bool = opt.config_flag("resume", "--resume"),
    config: Path = opt.CONFIG,
    set_: list[str] = opt.SET,
) -> None:
    from collabrl.eval.cautions import split_warning
    from collabrl.train.launch import is_main_process
    from collabrl.train.sft import train_sft

    cfg = opt.resolve(ctx, config, set_)
    opt.check(ctx, cfg.check)
    main = is_main_process()  # under accelerate launch, one process draws and reports
    if main:
        print_warnings(console, [split_warning(cfg.data, "SFT on")])
    with progress_bar(console, f"SFT · {cfg.model} on {cfg.data}", main) as progress:
        result = train_sft(cfg, progress, _report)
    if not main:
        return
    m = result.metrics
    loss = "n/a" if m["final_loss"] is None else f"{m['final_loss']:.4f}"
    resumed = f" (resumed at step {m['resumed_from']})" if m["resumed_from"] is not None else ""
    console.print(f"{m['steps']} steps{resumed} · final loss {loss}")
    console.print(
        f"model: {m['final']} (use it as --model; its card: final/README.md) · folder: "
        f"{result.out_dir} (metrics.jsonl, train_curves.png, checkpoints/)"
    )


DRY_RUN = typer.Option(
    False,
    "--dry-run",
    help="Resolve everything and print it (TRL's effective settings, batch and group "
    "sizes, who runs where, memory per device); load no weight, train nothing.",
)

ACCELERATE_CONFIG = typer.Option(
    None,
    "--accelerate-config",
    help="With --dry-run: the accelerate config file of the launch (its processes and "
    "ZeRO stage size the batch and memory figures).",
)

NUM_PROCESSES = typer.Option(
    None,
    "--num-processes",
    min=1,
    help="With --dry-run: the launch's processes, when `accelerate launch --num_processes` "
    "overrides the accelerate config file's.",
)


def _options(**options: tuple[Any, Any]) -> list[inspect.Parameter]:
    """Command parameters from `name=(type, typer.Option)` pairs."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter(name, keyword, default=default, annotation=kind)
        for name, (kind, default) in options.items()
    ]


# The options every GRPO-based method takes, around its own (its spec's `options`, and
# --eval-steps where it allows it). Its protocol's collaborators and flags (--teacher,
# --expert, --planner, …) come from the protocol registry (cli/options.py).
DATA_OPTIONS = _options(
    model=(str, opt.MODEL),
    data=(str, opt.config_option("data", "--data")),
    limit=(int, opt.config_option("limit", "--limit")),
)
EVAL_STEPS = _options(eval_steps=(int, opt.config_option("eval_steps", "--eval-steps")))
RUN_OPTIONS = _options(
    steps=(int, opt.config_option("steps", "--steps", "--max-steps")),
    prompts_per_step=(int, opt.config_option("prompts_per_step", "--prompts-per-step")),
    num_generations=(int, opt.config_option("sampling.n", "--num-generations", "--n")),
    max_tokens=(int, opt.MAX_TOKENS),
    temperature=(float, opt.TEMPERATURE),
    top_p=(float, opt.TOP_P),
    learning_rate=(float, opt.config_option("learning_rate", "--learning-rate", "--lr")),
    beta=(float, opt.config_option("beta", "--beta")),
    seed=(int, opt.config_option("seed", "--seed")),
    eval_data=(str, opt.config_option("eval_data", "--eval-data")),
    eval_limit=(int, opt.config_option("eval_limit", "--eval-limit")),
    device=(str, opt.DEVICE),
    report_to=(str, opt.config_option("report_to", "--report-to")),
    reward_func=(list[str], opt.config_option("reward_funcs", "--reward-func")),
    reward_mode=(str, opt.config_option("reward_mode", "--reward-mode")),
    lora=(bool, opt.config_flag("lora.enabled", "--lora")),
    out=(str, opt.OUT),
    resume=(bool, opt.config_flag("resume", "--resume")),
    config=(Path, opt.CONFIG),
    set_=(list[str], opt.SET),
    dry_run=(bool, DRY_RUN),
    accelerate_config=(Path, ACCELERATE_CONFIG),
    num_processes=(int, NUM_PROCESSES),
)


def _method_options(spec: MethodSpec[Any]) -> list[inspect.Parameter]:
    """The method's own options, each typed by the config field it sets."""
    from collabrl.cli.options import load_config_class

    config_class = load_config_class(f"{opt.TRAIN}{spec.name}")
    own = {
        "method_" + option.key.replace(".", "_"): (
            _field_type(config_class, option.key),
            opt.config_option(option.key, *option.decls),
        )
        for option in spec.options
    }
    return _options(**own)


def _field_type(config_class: type, key: str) -> Any:
    """The type of dotted config key `key` of `config_class`, None dropped."""
    node: Any = config_class
    for part in key.split("."):
        node = typing.get_type_hints(node)[part] if is_dataclass(node) else node
    args = [a for a in typing.get_args(node) if a is not type(None)]
    return args[0] if len(args) == 1 else node


def _method_click_command(spec: MethodSpec[Any]) -> click.Command:
    """The click command of `collab train NAME` for a method trained by GRPO."""
    builder = typer.Typer(add_completion=False)
    command = opt.config_command(f"{opt.TRAIN}{spec.name}")
    builder.command(spec.name, cls=command, help=spec.help)(_method_command(spec))
    return typer.main.get_command(builder)


def _method_command(spec: MethodSpec[Any]) -> Callable[..., None]:
    """`collab train METHOD` with the shared options and the method's own: their values
    reach the config through ctx (cli/options.py), so one body serves every method."""

    def command(
        ctx: typer.Context,
        *,
        config: Path | None,
        set_: list[str] | None,
        dry_run: bool,
        accelerate_config: Path | None,
        num_processes: int | None,
        **_config_options: Any,
    ) -> None:
        _train(ctx, config, set_, dry_run, accelerate_config, num_processes)

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    ctx = inspect.Parameter("ctx", positional, annotation=typer.Context)
    own = [*_method_options(spec), *(EVAL_STEPS if spec.eval_steps else [])]
    params = [ctx, *DATA_OPTIONS, *own, *RUN_OPTIONS]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {param.name: param.annotation for param in params}
    return command


@app.command("rollouts")
def rollouts(
    run: Path = typer.Argument(..., help="A training run folder (it holds rollouts.jsonl)."),
    step: int = typer.Option(None, "--step", help="Only this step (default: every step kept)."),
    last: bool = typer.Option(False, "--last", help="Only the last step kept."),
) -> None:
    """Print the episodes a grpo/relay/eapo/rsim run kept of its steps (`save_rollouts`)
    as transcripts, each segment coloured by its author, with their reward, its parts
    and their advantage: `collab view RUN`, which also reads an eval's samples."""
    from collabrl.cli.view import show

    show(run, step, last)


def _train(
    ctx: typer.Context,
    config: Path | None,
    set_: list[str] | None,
    dry_run: bool,
    accelerate_config: Path | None,
    num_processes: int | None,
) -> None:
    """The body of `collab train grpo|relay|eapo|rsim|…`: the command's options reach the
    config through ctx (cli/options.py); the command's name is the method. The run is
    resolved once, here, and handed down."""
    from collabrl.train.grpo import train_grpo
    from collabrl.train.launch import is_main_process
    from collabrl.train.plan import run_warnings
    from collabrl.train.resolve import resolve_run

    cfg = opt.resolve(ctx, config, set_)
    run = opt.check(ctx, lambda: resolve_run(cfg))
    if dry_run:
        _print_plan(run, accelerate_config, num_processes)
        return
    main = is_main_process()  # under accelerate launch, one process draws and reports
    if main:
        print_warnings(console, run_warnings(run))
    description = f"{cfg.method} · {cfg.model} on {cfg.data}"
    # Stepped: in a log, each step's line (`_report`) is its progress.
    with progress_bar(console, description, main, stepped=True) as progress:
        result = train_grpo(run, progress, _report)
    if not main:
        return
    # A column only where the run logged it (eapo's experts cut, not relay's).
    columns = {n: k for n, k in _step_columns(run).items() if any(k in h for h in result.history)}
    table = Table("step", *columns)
    for h in result.history:
        if "reward" in h:
            table.add_row(str(h["step"]), *(f"{h.get(key, 0):.3f}" for key in columns.values()))
    console.print(table)
    if result.evaluation:
        _print_evaluation(cfg.eval_data, result.evaluation)
    for label, path in run.method.outputs(result.out_dir).items():  # rsim: its planner
        console.print(f"{label}: {path}")
    console.print(
        f"model: {result.out_dir / 'final'} (use it as --model; its card: final/README.md) "
        f"· folder: {result.out_dir} (metrics.jsonl, "
        + (f"rollouts.jsonl: `collab view {result.out_dir}`, " if cfg.save_rollouts else "")
        + "train_curves.png, checkpoints/)"
    )


def _step_columns(run: ResolvedRun) -> dict[str, str]:
    """The per-step table's columns, header -> metrics.jsonl key: the method's own
    (rsim's), or the run's step line's (no calls for a protocol that makes none)."""
    from collabrl.train.run import step_line_keys

    if run.method.step_columns is not None:
        return dict(run.method.step_columns)
    return step_line_keys(run.protocol_spec)


def _report(line: str) -> None:
    """A step's line, above the bar in a terminal and on its own line in a batch log."""
    console.print(line, highlight=False, soft_wrap=True)


def _print_plan(
    run: ResolvedRun, accelerate_config: Path | None, num_processes: int | None
) -> None:
    """`--dry-run`: the resolved run, one table per section, then its warnings."""
    from collabrl.train.plan import plan_run

    plan = plan_run(run, accelerate_config, num_processes)
    for title, rows in plan.sections.items():
        table = Table(title=title, show_header=False, title_justify="left")
        for key, value in rows:
            table.add_row(key, value)
        console.print(table)
    print_warnings(console, plan.warnings)
    console.print("dry run: nothing was loaded or trained")


def _print_evaluation(data: str, evaluation: dict[str, dict]) -> None:
    """The held-out metrics of the starting and the trained policy, side by side."""
    from collabrl.train.held_out import LOGGED

    start, final = evaluation["start"], evaluation["final"]
    table = Table("held-out " + data, "start", "trained")
    for key in LOGGED:
        if key in start:
            table.add_row(key, f"{start[key]:.4f}", f"{final[key]:.4f}")
    console.print(table)
    paired = evaluation["paired"]
    console.print(
        f"of {int(start['problems'])} problems: {paired['gained']} newly solved, "
        f"{paired['lost']} lost (sign test p = {paired['p_value']:.3g}: the chance of a "
        "split this uneven if training changed nothing)"
    )
