"""One training run folder as one self-contained HTML page: how it ran (the config
header), the held-out start against the trained policy (eval.json), the curves, the
per-step table (metrics.jsonl) and the episodes of its first and last kept step
(rollouts.jsonl) coloured by author, with their reward, its parts and their advantage.

The page opens from disk with no network: CSS inline, the curves inline SVG drawn from
metrics.jsonl by the same code as train_curves.png (`curves_figure`; a run still training
has curves too, before that file is written), no script at all. It is rendered by Jinja2
from templates/run_page.html.j2 (shipped in the package) with autoescaping on: every
string read from the folder reaches the template as plain text and leaves it escaped,
since the policy writes anything (`<script>` in a completion stays text). The page's
Content-Security-Policy forbids scripts and fetches as a second line of defence.

The page is made to be shared: the config and its command line are shown redacted
(`collabrl.redact`: an `engine.api_key`, a password in a model URL). It is written over
no file of the run it shows, and over no other file but an earlier page (its generator
tag, GENERATOR) unless the caller forces it.
"""

from __future__ import annotations

import io
import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from collabrl import __version__, runs
from collabrl.episode import Author
from collabrl.errors import UserError
from collabrl.redact import redact_command_line, redact_config, redact_text
from collabrl.train.held_out import LOGGED
from collabrl.train.run import (
    EVALUATION,
    METRICS,
    ROLLOUTS,
    STEP_LINE_KEYS,
    curve_keys,
    curves_figure,
    logged_number,
)
from collabrl.train.trainer import CURVE_KEYS
from collabrl.userfiles import MAX_CONFIG_BYTES, parse_yaml, read_json, read_user_text

# Text colour and background of each author's segments (cli/transcript.py's STYLES are the
# terminal's). Keyed by Author so that a new author without a colour fails
# (tests/train/test_run_html.py), rather than rendering like the policy.
AUTHOR_COLOURS: dict[Author, tuple[str, str]] = {
    Author.POLICY: ("#1f2328", "transparent"),
    Author.TEACHER: ("#116329", "#dafbe1"),
    Author.EXPERT: ("#0a5c7a", "#ddf4ff"),
    Author.GUIDANCE: ("#8250df", "#fbefff"),
    Author.TOOL: ("#7d4e00", "#fff8c5"),
    Author.ENVIRONMENT: ("#6e7781", "#f6f8fa"),
}

# The per-step table: the columns a step's log line shows (STEP_LINE_KEYS), then these;
# a column only where the run logged it.
TABLE_KEYS = {
    **STEP_LINE_KEYS,
    "held-out pass@1": "eval/pass@1",
    "mean length": "completions/mean_length",
    "zero-std groups": "frac_reward_zero_std",
    "loss": "loss",
    "learning rate": "learning_rate",
    "s/step": "step_time",
}

# Kept episodes shown of the first and of the last step rollouts.jsonl holds.
EPISODES_PER_STEP = 4

# In every page's head: a file holding it is an earlier page, which a new one may replace.
GENERATOR = '<meta name="generator" content="collabrl run page">'
# Bytes of an existing file searched for GENERATOR (it sits in the first few hundred).
GENERATOR_WITHIN = 4096
# The run's files the page is made from: never written over, present or not yet (a live
# run writes eval.json at its end).
INPUTS = (runs.CONFIG, METRICS, ROLLOUTS, EVALUATION, runs.SAMPLES)

# No script, no network: styles and data: images only.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

# Matplotlib's SVG, made the same on every render: clip-path ids from a fixed salt (not a
# random one), no date, and text as SVG text in the page's font rather than glyph paths.
SVG_STYLE = {"svg.hashsalt": "collabrl run page", "svg.fonttype": "none"}


@cache
def _template() -> Any:
    """The page's template (package data, templates/run_page.html.j2), autoescaped and
    strict: a name the template uses that the page did not pass fails, never renders
    as nothing."""
    environment = Environment(
        loader=PackageLoader("collabrl.train", "templates"),
        autoescape=select_autoescape(default_for_string=True, default=True),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return environment.get_template("run_page.html.j2")


def run_html(run: Path) -> str:
    """The HTML page of the training run folder `run` (see the module docstring)."""
    if (run / runs.SAMPLES).is_file() and not (run / METRICS).is_file():
        raise UserError(
            f"{run} is an eval's folder: the HTML page is of a training run",
            f"collab view {run} prints its samples",
        )
    if not (run / runs.CONFIG).is_file():
        raise UserError(
            f"{run} is not a training run folder (no {runs.CONFIG})",
            "pass the --out folder of a collab train run",
        )
    config_text = read_user_text(run / runs.CONFIG, "config", MAX_CONFIG_BYTES)
    config = parse_yaml(config_text, f"config {run / runs.CONFIG}") or {}
    history = [r for r in runs.read_records(run / METRICS) if "train_runtime" not in r]
    rollouts = runs.read_records(run / ROLLOUTS)
    evaluation = _read_evaluation(run / EVALUATION) if (run / EVALUATION).is_file() else None
    return _template().render(
        # Our own constants, markup by design; nothing read from the run is marked safe.
        generator=Markup(GENERATOR),
        csp=Markup(CSP),
        title=_title(run, config if isinstance(config, dict) else {}),
        header=_header(config_text),
        config_yaml=yaml.safe_dump(redact_config(config), sort_keys=False, allow_unicode=True),
        evaluation=_evaluation(evaluation) if evaluation else None,
        curves=_curves(history),
        steps=_steps(history),
        transcripts=_transcripts(rollouts, run / ROLLOUTS),
        version=__version__,
        run=str(run),
    )


def write_run_html(run: Path, out: Path, force: bool = False) -> Path:
    """Write `run_html(run)` to `out` (its folder made) and give `out`; refused in one line
    when `out` is one of the run's INPUTS (through a link too), a folder, or, unless
    `force`, an existing file that is not an earlier page."""
    page = run_html(run)
    _check_target(run, out, force)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # Renamed over `out` (runs.replacing): a link at `out` is replaced, never followed.
        runs.write_atomic(out, page)
    except OSError as err:
        raise UserError(
            f"cannot write {out}: {err.strerror or err}", "pass --html a file path you can write"
        ) from err
    return out


def _check_target(run: Path, out: Path, force: bool) -> None:
    if out.is_dir():
        raise UserError(f"--html {out} is a folder", "pass a file path, e.g. run.html")
    target = os.path.realpath(out)
    for name in INPUTS:
        source = run / name
        if os.path.realpath(source) == target or (
            out.exists() and source.exists() and os.path.samefile(out, source)
        ):
            raise UserError(
                f"--html {out} is the run's own {name}: the page would write over it",
                "pass a path that is none of the run's files, e.g. run.html",
            )
    if os.path.lexists(out) and not force and not _is_page(out):
        raise UserError(
            f"--html {out} exists and is not a page of collab view",
            "pass another path, or add --force to replace it",
        )


def _is_page(path: Path) -> bool:
    """Whether `path` is a regular file that opens as an earlier page (GENERATOR)."""
    if not path.is_file():  # a FIFO would block the read; a device is no page
        return False
    try:
        with path.open("rb") as f:
            return GENERATOR.encode() in f.read(GENERATOR_WITHIN)
    except OSError:
        return False


def _read_evaluation(path: Path) -> dict[str, Any]:
    """eval.json, refused in one line unless each of its sections is a mapping (or absent,
    or null: a failed end-of-run evaluation keeps the ones it finished)."""
    evaluation = read_json(path, "run file")
    sections = ("start", "final", "paired")
    if not isinstance(evaluation, dict) or any(
        not isinstance(evaluation.get(key) or {}, dict) for key in sections
    ):
        raise UserError(
            f"{path} is not the held-out evaluation collab train writes (start, final, "
            "paired: mappings)",
            "delete it to leave the held-out section out of the page",
        )
    return evaluation


def _title(run: Path, config: dict[str, Any]) -> str:
    """`grpo · SmolLM2-135M on arith_train`, from what the config holds (SFT has no method)."""
    method = config.get("method", "sft")
    # Redacted before the name is taken: `http://user:pw@host` has no path to name it.
    model = Path(redact_text(str(config.get("model", "?"))).rstrip("/")).name
    return f"{method} · {model} on {redact_text(str(config.get('data', '?')))} · {run.name}"


def _header(config_text: str) -> str:
    """The config's header (command, date, versions, commit), redacted. The config itself
    is shown as read and written again as YAML (its comments aside), so that no secret
    survives in a form a line-by-line redaction would miss."""
    return "\n".join(
        _redact_header(line[2:]) for line in config_text.splitlines() if line.startswith("# ")
    )


def _redact_header(line: str) -> str:
    """A header line shown redacted: the command line word by word, any other for URLs."""
    name, colon, value = line.partition(": ")
    if name == "command" and colon:
        return f"command: {redact_command_line(value)}"
    return redact_text(line)


def _format(value: Any) -> str:
    """A logged value as the page shows it; text as it is (the template escapes it)."""
    number = logged_number(value)
    if number is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return str(value)  # counts: problems solved, lost
    if number and abs(number) < 1e-3:
        return f"{number:.2e}"  # learning rates
    return f"{number:.3f}"


def _evaluation(evaluation: dict[str, Any]) -> dict[str, Any]:
    """Held-out metrics of the starting and the trained policy (rows of metric, start,
    trained, change), and the paired change."""
    start, final = evaluation.get("start") or {}, evaluation.get("final") or {}
    rows = []
    for key in (*LOGGED, "problems"):
        if key in start or key in final:
            a, b = logged_number(start.get(key)), logged_number(final.get(key))
            change = f"{b - a:+.3f}" if a is not None and b is not None else ""
            rows.append((key, _format(start.get(key)), _format(final.get(key)), change))
    paired = evaluation.get("paired") or {}
    shown = {key: _format(paired.get(key)) for key in ("gained", "lost", "p_value")}
    return {"rows": rows, "paired": shown if paired else None}


def _by_step(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step: a held-out evaluation logs its own line at its step. A record
    without a step number is no row."""
    merged: dict[float, dict[str, Any]] = {}
    for record in history:
        step = logged_number(record.get("step"))
        if step is not None:
            merged.setdefault(step, {}).update(record)
    return list(merged.values())


def _curves(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The panels train_curves.png draws of this run (a GRPO-based run's CURVE_KEYS, SFT's
    loss) as inline SVG, with the keys drawn; None where there is none."""
    import matplotlib

    keys = CURVE_KEYS if any("reward" in h for h in history) else ("loss",)
    with matplotlib.rc_context(SVG_STYLE):
        # No title: the page's heading says whose curves these are.
        figure = curves_figure(history, keys)
        if figure is None:
            return None
        svg = io.StringIO()
        figure.savefig(svg, format="svg", metadata={"Date": None})
    import matplotlib.pyplot as plt  # after curves_figure chose the Agg backend

    plt.close(figure)
    # Markup from our own plot code: its only text is our CURVE_KEYS and numbers (no
    # title, no key of the run's), and the XML prologue goes (HTML has none inline).
    text = svg.getvalue()
    return {"svg": Markup(text[text.index("<svg") :]), "drawn": curve_keys(history, keys)}


def _steps(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-step table: TABLE_KEYS the run logged, one row per step."""
    steps = _by_step(history)
    columns = {name: key for name, key in TABLE_KEYS.items() if any(key in s for s in steps)}
    rows = [[str(s.get("step")), *(_format(s.get(key)) for key in columns.values())] for s in steps]
    return {"columns": list(columns), "rows": rows}


def _transcripts(rollouts: list[dict[str, Any]], path: Path) -> dict[str, Any] | None:
    """The kept episodes of the first and the last step rollouts.jsonl holds."""
    if not rollouts:
        return None
    # Steps as trainers write them; a record without one is of no step to show.
    steps = sorted({r["step"] for r in rollouts if logged_number(r.get("step")) is not None})
    if not steps:
        return {"note": f"No record of {path} holds a step number."}
    shown = [r for step in dict.fromkeys((steps[0], steps[-1])) for r in _of_step(rollouts, step)]
    return {
        "note": None,
        "legend": [_authored(author, author.value) for author in AUTHOR_COLOURS],
        "episodes": [_episode(record, path) for record in shown],
    }


def _of_step(rollouts: list[dict[str, Any]], step: Any) -> list[dict[str, Any]]:
    return [r for r in rollouts if r.get("step") == step][:EPISODES_PER_STEP]


def _episode(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """One kept episode: what it scored, the question, then its segments by author."""
    episode = runs.episode_in(record, f"{path}: a step {record.get('step')} record")
    advantage = logged_number(record.get("advantage"))
    facts = [
        f"answer {episode.answer}" if episode.answer is not None else "no answer",
        f"gold {record['gold']}" if "gold" in record else "",
        f"end {episode.end}" if episode.end is not None else "",
        f"reward {_format(record['reward'])}" if record.get("reward") is not None else "",
        _parts(record.get("rewards")),
        f"advantage {advantage:+.3f}" if advantage is not None else "",
        f"call ratio {episode.call_ratio_realised():.3f}" if episode.calls else "",
    ]
    correct = record.get("correct")
    return {
        "step": record.get("step"),
        "problem_id": episode.problem_id,
        "sample": episode.meta.get("sample", "?"),
        "correct": None if correct is None else bool(correct),
        "facts": [fact for fact in facts if fact],
        "question": episode.meta.get("question"),
        "segments": [_authored(s.author, s.shown_text) for s in episode.segments],
    }


def _parts(parts: Any) -> str:
    """The reward's parts by function, `parts (accuracy 1.000, format 0.100)`; a part that
    did not apply (None) shows as n/a."""
    if not isinstance(parts, dict) or not parts:
        return ""
    shown = ", ".join(
        f"{name} {_format(value) if value is not None else 'n/a'}" for name, value in parts.items()
    )
    return f"parts ({shown})"


def _authored(author: Author, text: str) -> dict[str, str]:
    """`text` with its author's colours; an author without colours fails here, loudly."""
    colour, background = AUTHOR_COLOURS[author]
    return {"author": author.value, "colour": colour, "background": background, "text": text}
