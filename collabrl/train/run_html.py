"""One training run folder as one self-contained HTML page: how it ran (the config
header), the held-out start against the trained policy (eval.json), the curves, the
per-step table (metrics.jsonl) and the episodes of its first and last kept step
(rollouts.jsonl) coloured by author, with their reward, its parts and their advantage.

The page opens from disk with no network: CSS inline, curves as inline SVG drawn here
from metrics.jsonl (so a run still training has curves too, before train_curves.png is
written), no script at all. Every string read from the folder is escaped, since the
policy writes anything (`<script>` in a completion stays text); the page's
Content-Security-Policy forbids scripts and fetches as a second line of defence.

The page is made to be shared: the config and its command line are shown redacted
(`collabrl.redact`: an `engine.api_key`, a password in a model URL). It is written over
no file of the run it shows, and over no other file but an earlier page (its generator
tag, GENERATOR) unless the caller forces it.
"""

from __future__ import annotations

import html
import math
import os
import secrets
from pathlib import Path
from typing import Any

import yaml

from collabrl import __version__, runs
from collabrl.episode import Author
from collabrl.errors import UserError
from collabrl.redact import redact_command_line, redact_config, redact_text
from collabrl.train.held_out import LOGGED
from collabrl.train.run import EVALUATION, METRICS, ROLLOUTS, STEP_LINE_KEYS
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

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1f2328; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
pre { background: #f6f8fa; padding: 8px 10px; font-size: 12px; white-space: pre-wrap;
  word-break: break-word; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #d0d7de; padding: 3px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.curves { display: flex; flex-wrap: wrap; gap: 12px; }
.curve text { font: 11px system-ui, sans-serif; fill: #57606a; }
.curve .title { font-size: 12px; fill: #1f2328; font-weight: 600; }
.episode { border: 1px solid #d0d7de; border-radius: 6px; margin: 12px 0; padding: 8px 12px; }
.episode h3 { font-size: 14px; margin: 0 0 4px; }
.facts { color: #57606a; font-size: 13px; }
.transcript { background: none; border-left: 3px solid #d0d7de; font-size: 13px; }
.question { margin: 4px 0; }
.ok { color: #1a7f37; } .wrong { color: #cf222e; }
"""


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
    title = _title(run, config if isinstance(config, dict) else {})
    body = [
        f"<h1>{_e(title)}</h1>",
        _provenance(config_text, config),
        _evaluation(evaluation) if evaluation else "",
        _curves(history),
        _steps(history),
        _transcripts(rollouts, run / ROLLOUTS),
        f'<p class="facts">written by collabrl {_e(__version__)} from {_e(str(run))}</p>',
    ]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{GENERATOR}'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body></html>\n"
    )


def write_run_html(run: Path, out: Path, force: bool = False) -> Path:
    """Write `run_html(run)` to `out` (its folder made) and give `out`; refused in one line
    when `out` is one of the run's INPUTS (through a link too), a folder, or, unless
    `force`, an existing file that is not an earlier page."""
    page = run_html(run)
    _check_target(run, out, force)
    # Written beside it, then renamed over it: a link at `out` is replaced, never followed.
    # The temporary name is new (O_EXCL, random): no link planted there is followed either.
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(8)}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            f.write(page.encode("utf-8"))
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
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


def _e(value: object) -> str:
    """Any value read from the run folder, as HTML text (quotes too: it may sit in an
    attribute)."""
    return html.escape(str(value), quote=True)


def _title(run: Path, config: dict[str, Any]) -> str:
    """`grpo · SmolLM2-135M on arith_train`, from what the config holds (SFT has no method)."""
    method = config.get("method", "sft")
    # Redacted before the name is taken: `http://user:pw@host` has no path to name it.
    model = Path(redact_text(str(config.get("model", "?"))).rstrip("/")).name
    return f"{method} · {model} on {redact_text(str(config.get('data', '?')))} · {run.name}"


def _provenance(config_text: str, config: Any) -> str:
    """The config header (command, date, versions, commit) and the config itself, folded,
    both redacted: the config as read, written again as YAML (its comments aside), so
    that no secret survives in a form a line-by-line redaction would miss."""
    header = [
        _redact_header(line[2:]) for line in config_text.splitlines() if line.startswith("# ")
    ]
    shown = yaml.safe_dump(redact_config(config), sort_keys=False, allow_unicode=True)
    return (
        f"<pre>{_e(chr(10).join(header))}</pre>" if header else ""
    ) + f"<details><summary>config.yaml</summary><pre>{_e(shown)}</pre></details>"


def _redact_header(line: str) -> str:
    """A header line shown redacted: the command line word by word, any other for URLs."""
    name, colon, value = line.partition(": ")
    if name == "command" and colon:
        return f"command: {redact_command_line(value)}"
    return redact_text(line)


def _number(value: Any) -> float | None:
    """A logged value as a finite float, or None (absent, text, NaN, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _format(value: Any) -> str:
    number = _number(value)
    if number is None:
        return "" if value is None else _e(value)
    if isinstance(value, int):
        return str(value)  # counts: problems solved, lost
    if number and abs(number) < 1e-3:
        return f"{number:.2e}"  # learning rates
    return f"{number:.3f}"


def _evaluation(evaluation: dict[str, Any]) -> str:
    """Held-out metrics of the starting and the trained policy, and the paired change."""
    start, final = evaluation.get("start") or {}, evaluation.get("final") or {}
    rows = []
    for key in (*LOGGED, "problems"):
        if key in start or key in final:
            a, b = _number(start.get(key)), _number(final.get(key))
            change = f"{b - a:+.3f}" if a is not None and b is not None else ""
            rows.append(
                f"<tr><td>{_e(key)}</td><td>{_format(start.get(key))}</td>"
                f"<td>{_format(final.get(key))}</td><td>{change}</td></tr>"
            )
    paired = evaluation.get("paired") or {}
    note = (
        f"<p>newly solved {_format(paired.get('gained'))} · lost {_format(paired.get('lost'))}"
        f" · sign test p = {_format(paired.get('p_value'))}</p>"
        if paired
        else ""
    )
    return (
        '<h2>Held-out: start against trained</h2><table class="evaluation">'
        "<tr><th>metric</th><th>start</th><th>trained</th><th>change</th></tr>"
        + "".join(rows)
        + "</table>"
        + note
    )


def _by_step(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step: a held-out evaluation logs its own line at its step. A record
    without a step number is no row."""
    merged: dict[float, dict[str, Any]] = {}
    for record in history:
        step = _number(record.get("step"))
        if step is not None:
            merged.setdefault(step, {}).update(record)
    return list(merged.values())


def curve_keys(history: list[dict[str, Any]]) -> list[str]:
    """What `plot_curves` draws of this run: a GRPO-based run's CURVE_KEYS, SFT's loss;
    each only where it was logged other than as zeros throughout."""
    keys = CURVE_KEYS if any("reward" in h for h in history) else ("loss",)
    return [k for k in keys if any(y for _, y in _series(history, k))]


def _series(history: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(step, value) of every record that logged `key` as a finite number."""
    return [
        (float(h["step"]), v)
        for h in history
        if _number(h.get("step")) is not None and (v := _number(h.get(key))) is not None
    ]


def _curves(history: list[dict[str, Any]]) -> str:
    panels = [_svg(key, history) for key in curve_keys(history)]
    if not panels:
        return ""
    return f'<h2>Curves</h2><div class="curves">{"".join(panels)}</div>'


# A curve panel's size and its plot area's margins, in pixels.
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 300, 190, 48, 12, 24, 28


def _svg(key: str, history: list[dict[str, Any]]) -> str:
    """One panel: `key` against the step, as `plot_curves` draws it, in inline SVG."""
    points = _series(history, key)  # not empty: curve_keys drew it
    xs, ys = [x for x, _ in points], [y for _, y in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)

    def scale(value: float, low: float, high: float, start: float, end: float) -> float:
        # A single point or a flat series sits in the middle.
        return (
            (start + end) / 2
            if high == low
            else start + (value - low) / (high - low) * (end - start)
        )

    plot = [
        (
            scale(x, x0, x1, LEFT, WIDTH - RIGHT),
            scale(y, y0, y1, HEIGHT - BOTTOM, TOP),
        )
        for x, y in points
    ]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in plot)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#1f77b4"/>' for x, y in plot)
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    return (
        f'<svg class="curve" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{_e(key)}">'
        f'<text class="title" x="{WIDTH / 2}" y="15" text-anchor="middle">{_e(key)}</text>'
        f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" '
        'fill="none" stroke="#d0d7de"/>'
        f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>{dots}'
        f'<text x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end">{_format(y1)}</text>'
        f'<text x="{LEFT - 4}" y="{bottom}" text-anchor="end">{_format(y0)}</text>'
        f'<text x="{LEFT}" y="{bottom + 14}">{x0:g}</text>'
        f'<text x="{right}" y="{bottom + 14}" text-anchor="end">{x1:g}</text>'
        f'<text x="{(LEFT + right) / 2}" y="{HEIGHT - 2}" text-anchor="middle">step</text>'
        "</svg>"
    )


def _steps(history: list[dict[str, Any]]) -> str:
    """The per-step table: TABLE_KEYS the run logged, one row per step."""
    steps = _by_step(history)
    if not steps:
        return "<h2>Steps</h2><p>No step logged yet.</p>"
    columns = {name: key for name, key in TABLE_KEYS.items() if any(key in s for s in steps)}
    head = "".join(f"<th>{_e(name)}</th>" for name in columns)
    rows = "".join(
        f'<tr class="step"><td>{_e(s.get("step"))}</td>'
        + "".join(f"<td>{_format(s.get(key))}</td>" for key in columns.values())
        + "</tr>"
        for s in steps
    )
    return f'<h2>Steps</h2><table class="steps"><tr><th>step</th>{head}</tr>{rows}</table>'


def _transcripts(rollouts: list[dict[str, Any]], path: Path) -> str:
    """The kept episodes of the first and the last step rollouts.jsonl holds."""
    if not rollouts:
        return ""
    # Steps as trainers write them; a record without one is of no step to show.
    steps = sorted({r["step"] for r in rollouts if _number(r.get("step")) is not None})
    if not steps:
        return f"<h2>Transcripts</h2><p>No record of {_e(path)} holds a step number.</p>"
    shown = [r for step in dict.fromkeys((steps[0], steps[-1])) for r in _of_step(rollouts, step)]
    legend = " ".join(_authored(author, author) for author in AUTHOR_COLOURS)
    return f'<h2>Transcripts</h2><p class="legend">authors: {legend}</p>' + "".join(
        _episode(record, path) for record in shown
    )


def _of_step(rollouts: list[dict[str, Any]], step: Any) -> list[dict[str, Any]]:
    return [r for r in rollouts if r.get("step") == step][:EPISODES_PER_STEP]


def _episode(record: dict[str, Any], path: Path) -> str:
    """One kept episode: what it scored, the question, then its segments by author."""
    episode = runs.episode_in(record, f"{path}: a step {record.get('step')} record")
    correct = record.get("correct")
    verdict = (
        '<span class="ok">correct</span>'
        if correct
        else '<span class="wrong">wrong</span>'
        if correct is not None
        else ""
    )
    facts = [
        verdict,
        f"answer {_e(episode.answer)}" if episode.answer is not None else "no answer",
        f"gold {_e(record['gold'])}" if "gold" in record else "",
        f"end {_e(episode.end)}" if episode.end is not None else "",
        f"reward {_format(record['reward'])}" if record.get("reward") is not None else "",
        _parts(record.get("rewards")),
        f"advantage {_number(record['advantage']):+.3f}"
        if _number(record.get("advantage")) is not None
        else "",
        f"call ratio {episode.call_ratio_realised():.3f}" if episode.calls else "",
    ]
    question = episode.meta.get("question")
    segments = "".join(_authored(s.author, s.shown_text) for s in episode.segments)
    return (
        '<div class="episode">'
        f"<h3>step {_e(record.get('step'))} · {_e(episode.problem_id)} · "
        f"sample {_e(episode.meta.get('sample', '?'))}</h3>"
        f'<div class="facts">{" · ".join(f for f in facts if f)}</div>'
        + (f'<div class="question"><b>question</b> {_e(question)}</div>' if question else "")
        + f'<pre class="transcript">{segments}</pre></div>'
    )


def _parts(parts: Any) -> str:
    """The reward's parts by function, `(accuracy 1.000, format 0.100)`; a part that did
    not apply (None) shows as n/a."""
    if not isinstance(parts, dict) or not parts:
        return ""
    shown = ", ".join(
        f"{_e(name)} {_format(value) if value is not None else 'n/a'}"
        for name, value in parts.items()
    )
    return f"parts ({shown})"


def _authored(author: Author, text: str) -> str:
    """`text` in its author's colours; an author without colours fails here, loudly."""
    colour, background = AUTHOR_COLOURS[author]
    return (
        f'<span class="author-{author}" title="{_e(author)}" '
        f'style="color: {colour}; background: {background}">{_e(text)}</span>'
    )
