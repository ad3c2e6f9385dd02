"""Output a batch job can read (a SLURM log, a pipe) and `--help` with every default.

Not a terminal: tables at the width they need (rich would use 80 columns and cut cells to
`0.…`), progress as periodic log lines instead of a bar that is never drawn, no tqdm bars of
the libraries. The consoles are real rich consoles writing into a StringIO (not a
terminal), or the real `collab` script writing into a pipe.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from rich.table import Table
from typer.testing import CliRunner

import collabrl
from collabrl.cli import options as opt
from collabrl.cli.console import LIBRARY_BAR_SWITCHES, make_console, quiet_library_bars
from collabrl.cli.main import app
from collabrl.cli.progress import ProgressLog, duration, progress_bar
from collabrl.config import inline_yaml, to_dict
from collabrl.data.benchmarks import registry

COLLAB = Path(sys.executable).with_name("collab")
runner = CliRunner()


def _piped_env(**extra: str) -> dict[str, str]:
    """A batch job's environment: no COLUMNS, no forced colour."""
    drop = ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE", *LIBRARY_BAR_SWITCHES)
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


# --- tables at full width, plain text ------------------------------------------------------------


def test_piped_table_keeps_every_cell_whole() -> None:
    """`collab benchmarks | cat` (stdin not a terminal either, as in a SLURM job): each
    benchmark's row on one line, its description whole; no colour codes."""
    result = subprocess.run(
        [str(COLLAB), "benchmarks"],
        env=_piped_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for spec in registry().values():
        row = next(line for line in lines if line.startswith(f"│ {spec.name} "))
        assert spec.description in row, row
    assert "\x1b[" not in result.stdout


def test_log_console_is_as_wide_as_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    out = io.StringIO()
    console = make_console(file=out)
    table = Table("run", *(f"metric number {i}" for i in range(12)))
    table.add_row("a-long-run-name/aime24", *(f"0.{i}234" for i in range(12)))
    console.print(table)
    console.print("[bold]plain[/bold] words")
    console.rule("step 3")
    text = out.getvalue()
    assert "…" not in text and "0.11234" in text and "metric number 11" in text
    assert "plain words" in text and "\x1b[" not in text
    rule = text.splitlines()[-1]
    assert len(rule) == 80 and "step 3" in rule  # a rule does not span the wide console


def test_columns_still_decides_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    assert make_console(file=io.StringIO()).width == 50


# --- progress as log lines -----------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_bar_logs_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with progress_bar(make_console(file=out), "eval aime24") as progress:
        for done in range(1, 121):
            progress(done, 120)
    lines = out.getvalue().splitlines()
    # The first, one per tenth, and the last: no bar, no carriage returns.
    assert len(lines) == 11 and "\r" not in out.getvalue()
    assert lines[0].startswith("eval aime24: 1/120 (0%) 0s elapsed")
    assert lines[4].startswith("eval aime24: 48/120 (40%)")
    assert lines[-1].startswith("eval aime24: 120/120 (100%)")


def test_a_password_in_the_model_url_is_not_in_the_progress_line() -> None:
    """`collab eval --model http://user:password@host/v1` names the model in its progress
    lines, which a SLURM log keeps and people share: the password is not in them."""
    out = io.StringIO()
    with progress_bar(make_console(file=out), "gsm8k · http://me:hunter2@host/v1") as progress:
        progress(1, 2)
    assert out.getvalue().startswith("gsm8k · http://me:<redacted>@host/v1: 1/2 (50%)")
    assert "hunter2" not in out.getvalue()


def test_progress_log_times_and_pace() -> None:
    """A line every `every_s` between tenths; the time left is this run's pace from the
    first report on (a model load before it, or a resumed run's part, left out)."""
    out, clock = io.StringIO(), _Clock()
    log = ProgressLog(make_console(file=out), "eval aime24", every_s=60, clock=clock)
    clock.now = 30.0  # loading the model
    log(40, 1000)
    for done in range(41, 53):
        clock.now += 12.0
        log(done, 1000)  # 12 s each: 60 s since the last line at 45 and at 50
    clock.now += 1.0
    log(52, 1000)  # nothing new
    lines = out.getvalue().splitlines()
    assert lines == [
        "eval aime24: 40/1000 (4%) 30s elapsed",
        "eval aime24: 45/1000 (4%) 1m30s elapsed, ~3h11m left",
        "eval aime24: 50/1000 (5%) 2m30s elapsed, ~3h10m left",
    ]


def test_a_new_total_starts_a_new_phase() -> None:
    """Training's steps, then its held-out evaluation through the same callback: the
    evaluation's lines count from its own start, at its own tenths."""
    out, clock = io.StringIO(), _Clock()
    log = ProgressLog(make_console(file=out), "relay", every_s=600, clock=clock)
    for step in (1, 2):
        clock.now += 100.0
        log(step, 2)
    for done in range(1, 11):
        clock.now += 1.0
        log(done, 10)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["relay: 1/2 (50%) 1m40s elapsed", "relay: 2/2 (100%) 3m20s elapsed"]
    assert lines[2] == "relay: 1/10 (10%) 0s elapsed" and len(lines) == 12
    assert lines[-1] == "relay: 10/10 (100%) 9s elapsed"


def test_progress_log_unknown_total_and_no_display_elsewhere() -> None:
    out = io.StringIO()
    ProgressLog(make_console(file=out), "filter")(3, 0)
    assert out.getvalue() == "filter: 3 done, 0s elapsed\n"
    quiet = io.StringIO()
    with progress_bar(make_console(file=quiet), "train", shown=False) as progress:
        progress(1, 2)  # another process of an `accelerate launch`
    assert quiet.getvalue() == ""


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0s"), (59, "59s"), (72, "1m12s"), (3600 + 180, "1h03m")]
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


# --- the libraries' own bars ---------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def no_switches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in LIBRARY_BAR_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    yield


def test_library_bars_are_off_when_stderr_is_not_a_terminal(no_switches, monkeypatch) -> None:
    quiet_library_bars(_Terminal())
    assert not any(name in os.environ for name in LIBRARY_BAR_SWITCHES)
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "0")  # the user's choice stays
    quiet_library_bars(io.StringIO())
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "0"


@pytest.mark.slow
def test_piped_eval_prints_log_lines_and_no_library_bar(tmp_path: Path) -> None:
    """`collab eval arith --limit 2 --model smollm2-135m 2>&1 | cat`: transformers drew
    "Loading weights" bars into the log, and our own bar printed nothing."""
    result = subprocess.run(
        [str(COLLAB), "eval", "arith", "--limit", "2", "--model", "smollm2-135m"]
        + ["--out", str(tmp_path / "run")],
        env=_piped_env(OMP_NUM_THREADS="1"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout
    log = result.stdout
    assert "Loading weights" not in log and "it/s]" not in log and "\r" not in log
    assert "arith · smollm2-135m: 2/2 (100%)" in log
    assert "│ pass@1 " in log and "\x1b[" not in log


# --- `--help` shows every default ----------------------------------------------------------------


def _config_commands() -> list[tuple[list[str], typer.core.TyperCommand]]:
    """(the words that run it, the command) of every command with a config."""
    found = []

    def walk(words: list[str], command) -> None:
        if hasattr(command, "list_commands"):  # a group: `collab train` builds its own
            context = typer.Context(command)
            for name in command.list_commands(context):
                walk([*words, name], command.get_command(context, name))
        if getattr(command, "config_class", ""):
            found.append((words, command))

    walk([], typer.main.get_command(app))
    return found


def test_every_command_with_a_config_is_found() -> None:
    assert {c.config_class for _, c in _config_commands()} == set(opt.CONFIG_CLASSES)


def _help_rows(words: list[str]) -> dict[str, str]:
    """`--help` of the command `words` runs: option -> its row's text, on one line."""
    result = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "2000"})
    assert result.exit_code == 0, result.stdout
    rows: dict[str, str] = {}
    current = None
    for line in result.stdout.splitlines():
        cells = line.replace("│", " ").split()
        if cells and cells[0] == "*":  # a required one
            cells = cells[1:]
        if cells and cells[0].startswith("--"):
            current = cells[0].split(",")[0]
            rows[current] = ""
        if current is not None and line.startswith("│"):
            rows[current] += " " + " ".join(cells)
        if line.startswith("╰"):
            current = None
    return rows


def _config_value(data: dict, key: str) -> object:
    for part in key.split("."):
        data = data[part]
    return data


@pytest.mark.parametrize(
    ("words", "command"),
    _config_commands(),
    ids=[" ".join(w) for w, _ in _config_commands()],
)
def test_help_shows_every_config_default(words: list[str], command) -> None:
    """Each config-bound option shows the value `collab config show COMMAND` prints for
    its key (a train method's fixed keys applied); a None or empty one shows nothing."""
    config = to_dict(opt.load_config(command.config_class, None, {}, []))
    rows = _help_rows(words)
    params = command.get_params(typer.Context(command))
    options = [p for p in params if p.param_type_name == "option" and not p.hidden]
    checked = 0
    for param in options:
        key = opt.config_key(param)
        if key is None or key.startswith("protocol.options."):  # a plugin's, not ours
            continue
        value, row = _config_value(config, key), rows[param.opts[0]]
        if value is None or value in ([], {}):
            assert "[default:" not in row, (param.opts[0], row)
        else:
            shown = inline_yaml(value)
            if param.secondary_opts:  # `--lora/--no-lora`: the flag that gives the default
                shown = (param.opts if value else param.secondary_opts)[0].removeprefix("--")
            assert f"[default: {shown}]" in row, (param.opts[0], row)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize(
    ("words", "shown"),
    [
        (["eval", "run"], {"--n": "1", "--max-tokens": "1024", "--temperature": "0.0"}),
        (["train", "relay"], {"--steps": "20", "--learning-rate": "1.0e-06"}),
        (["train", "relay"], {"--num-generations": "4", "--max-tokens": "128"}),
    ],
)
def test_help_shows_the_defaults_the_issue_names(words: list[str], shown: dict) -> None:
    rows = _help_rows(words)
    for option, value in shown.items():
        assert f"[default: {value}]" in rows[option], (option, rows[option])


def test_every_console_comes_from_make_console() -> None:
    """A console made anywhere else would lay tables out in 80 columns in a batch log."""
    package = Path(collabrl.__file__).parent
    made_elsewhere = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "console.py" and "Console(" in path.read_text()
    ]
    assert made_elsewhere == []
