"""The HTML page of one run folder (`collabrl.train.run_html`): its structure and its
escaping on a folder written by hand in the formats the trainers write (fast), and the
page of a real tiny GRPO run rendered by headless Chromium (slow): the DOM it builds and
a screenshot that is not blank."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from collabrl.episode import Author, EndReason, Episode, Segment
from collabrl.errors import UserError
from collabrl.train.run_html import AUTHOR_COLOURS, run_html, write_run_html

HOSTILE = '<script>document.title="pwned"</script><img src=x onerror="document.title=1">'

CONFIG = """\
# written by collabrl: keys left out are defaults this run never reads
# command: collab train relay --model smollm2-135m --teacher reference --out runs/relay
# date: 2026-11-27T11:04:35+00:00
# versions: collabrl 0.1.0, torch 2.13.0+cpu, transformers 5.24.0, trl 1.16.0
method: relay
model: smollm2-135m
data: arith_train
prompt: "{HOSTILE}"
"""


def _step(step: int, reward: float) -> dict[str, Any]:
    """A metrics.jsonl line of a relay step, with the keys TRL and the rollout log."""
    return {
        "step": step,
        "epoch": step / 4,
        "loss": 0.01 * step,
        "learning_rate": 1e-6,
        "completions/mean_length": 40.0 + step,
        "reward": reward,
        "frac_reward_zero_std": 0.5,
        "episodes/accuracy": reward,
        "episodes/call_ratio": 0.1 * step,
        "episodes/calls": 0.0,  # zeros throughout: no curve, as plot_curves leaves it out
        f"rewards/{HOSTILE}/mean": reward,  # a user's reward function logs under its name
        "step_time": 2.5,
    }


def _episode(step: int, sample: int, text: str) -> Episode:
    return Episode(
        problem_id=f"arith-train-add1-000{step}",
        prompt_ids=[1, 2, 3],
        segments=[
            Segment(Author.POLICY, text, [4, 5], [-0.5, -0.25]),
            Segment(Author.ENVIRONMENT, "<call>4</call>", [6]),
            Segment(Author.TEACHER, " 3 + 3 = 6", [7, 8], meta={"accepted": True}),
            Segment(Author.EXPERT, "", [], meta={"error": "timed out"}),
            Segment(Author.POLICY, " so \\boxed{6}", [9], [-0.1]),
        ],
        answer="6",
        end=EndReason.EOS,
        meta={"protocol": "relay", "sample": sample, "question": "What is 3 + 3?"},
    )


def _rollout(step: int, sample: int, text: str, scored: bool = True) -> dict[str, Any]:
    """A rollouts.jsonl line: the extras, then (written since the reward log) the reward,
    its parts and the advantage, then the episode."""
    scores = (
        {"reward": 1.0, "rewards": {"accuracy": 1.0, "brevity": None}, "advantage": 0.7071}
        if scored
        else {}
    )
    return {
        "step": step,
        "correct": True,
        "gold": "6",
        "call_ratio": 0.4,
        "end": "eos",
        **scores,
        "episode": _episode(step, sample, text).to_dict(),
    }


class _Parsed(HTMLParser):
    """The elements a browser's parser makes of a page, and its text with the entities
    read: what the page shows, however the escaping spelled it."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.texts: list[str] = []
        self.feed(page)
        self.close()
        self.text = "".join(self.texts)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.texts.append(data)


def _panels(page: str) -> int:
    """The curve panels of the page's figure (matplotlib names each axes' group)."""
    return len(re.findall(r'<g id="axes_\d+"', page))


def _lines(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A relay run folder of three steps, held-out evaluation included, written by hand
    in the trainers' record formats (train/run.py, train/rollout.py, train/grpo.py)."""
    folder = tmp_path / "relay-run"
    folder.mkdir()
    (folder / "config.yaml").write_text(CONFIG.replace("{HOSTILE}", HOSTILE.replace('"', "'")))
    held_out = {"step": 2, "eval/pass@1": 0.25, "eval/call_ratio": 0.1}
    summary = {"step": 3, "train_runtime": 9.0, "train_loss": 0.02}
    _lines(
        folder / "metrics.jsonl", [_step(1, 0.0), _step(2, 0.5), held_out, _step(3, 1.0), summary]
    )
    rollouts = [_rollout(1, 0, "old record", scored=False), _rollout(1, 1, "first")]
    rollouts += [_rollout(2, s, "step two text") for s in range(2)]  # neither first nor last
    rollouts += [_rollout(3, 0, HOSTILE), _rollout(3, 1, "last")]
    _lines(folder / "rollouts.jsonl", rollouts)
    metrics = {"pass@1": 0.25, "call_ratio": 0.0, "mean_completion_tokens": 30.0, "problems": 4}
    evaluation = {
        "start": metrics,
        "final": {**metrics, "pass@1": 0.5},
        "paired": {"gained": 1, "lost": 0, "p_value": 1.0},
    }
    (folder / "eval.json").write_text(json.dumps(evaluation))
    return folder


def test_every_author_has_a_colour() -> None:
    """A new Author without a colour would render as the policy's text: it fails here."""
    assert set(AUTHOR_COLOURS) == set(Author)


def test_the_page_holds_the_steps_curves_evaluation_and_transcripts(run: Path) -> None:
    page = run_html(run)
    assert page.count('<tr class="step">') == 3  # the held-out line joins its step's row
    assert "<th>held-out pass@1</th>" in page and "<td>0.250</td>" in page
    assert "train_runtime" not in page
    # Curves, drawn as train_curves.png is: the keys logged other than as zeros (calls,
    # all 0, is left out), in one inline SVG figure whose caption names them.
    assert page.count("<svg") == 1 and _panels(page) == 6
    caption = page.split("<figcaption>")[1].split("</figcaption>")[0]
    assert "eval/pass@1" in caption and "episodes/calls" not in caption
    assert "<td>pass@1</td><td>0.250</td><td>0.500</td><td>+0.250</td>" in page
    assert "newly solved 1 · lost 0" in page
    # The first and the last step's episodes; step 2's are not shown.
    assert page.count('class="episode"') == 4 and "step two text" not in page
    assert "command: collab train relay" in page  # the provenance header
    for author in Author:
        assert f'class="author-{author}"' in page  # the legend
    # Each segment in its author's colours: the teacher's text in the teacher's span.
    teacher = page.split("> 3 + 3 = 6</span>")[0].rsplit("<span", 1)[1]
    assert teacher.startswith(' class="author-teacher"') and "#dafbe1" in teacher
    assert "[expert unavailable: timed out]" in page


def test_reward_parts_and_advantage_show_where_recorded(run: Path) -> None:
    page = run_html(run)
    assert page.count("reward 1.000 · parts (accuracy 1.000, brevity n/a) · advantage +0.707") == 3
    old = page.split("old record")[0].rsplit('class="episode"', 1)[1]
    assert "advantage" not in old and "correct" in old  # a record written before them


def test_model_written_text_stays_text(run: Path) -> None:
    """The policy writes anything: markup in a completion, the config or a logged key is
    shown, never run or parsed."""
    page = run_html(run)
    assert "<script" not in page.lower() and "<img" not in page.lower()
    parsed = _Parsed(page)
    assert not {"script", "img"} & set(parsed.tags)  # no element of the run's text
    assert HOSTILE in parsed.text  # shown in the transcript as written
    assert HOSTILE.replace('"', "'") in parsed.text  # the config's prompt too
    # No key of the run's reaches the curves: the figure holds our CURVE_KEYS only.
    figure = page.split("<svg", 1)[1].split("</svg>")[0]
    assert "pwned" not in figure and "onerror" not in figure
    assert "default-src 'none'" in page  # the CSP: no script, no fetch, even if escaping failed


SECRET_CONFIG = """\
# written by collabrl: keys left out are defaults this run never reads
# command: collab train relay --model http://me:hunter2@h/v1 --api-key sk-ARG --set x_token=hf_SET
method: relay
model: http://me:hunter2@host/v1?token=t0k
data: arith_train
engine:
  api_key: sk-KEY
trl:
  hub_token: hf_TRL
protocol:
  teacher: https://ghp_TOKEN@teacher.example/v1
"""


def test_the_page_shows_no_secret_of_the_config_or_its_command(run: Path) -> None:
    """The page is made to be shared: the API key, the URL passwords and tokens and the
    command line's --api-key are redacted, in the header, the config and the title."""
    (run / "config.yaml").write_text(SECRET_CONFIG)
    page = run_html(run)
    for secret in ("hunter2", "t0k", "sk-ARG", "hf_SET", "sk-KEY", "hf_TRL", "ghp_TOKEN"):
        assert secret not in page
    shown = _Parsed(page).text
    redacted = "<redacted>"
    assert f"--api-key '{redacted}'" in shown
    assert f"api_key: {redacted}" in shown and f"hub_token: {redacted}" in shown
    assert f"model: http://me:{redacted}@host/v1?token={redacted}" in shown
    assert "data: arith_train" in shown and "method: relay" in shown  # the rest as it is


def test_a_run_that_has_not_logged_a_step_yet(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("method: grpo\nmodel: m\ndata: arith_train\n")
    page = run_html(tmp_path)
    assert "No step logged yet" in page and "<svg" not in page and "Transcripts" not in page


def test_an_sft_run_draws_its_loss(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("model: m\ndata: runs/warmup\n")
    _lines(tmp_path / "metrics.jsonl", [{"step": s, "loss": 2.0 / s} for s in (1, 2, 3)])
    page = run_html(tmp_path)
    assert _panels(page) == 1 and "<figcaption>loss</figcaption>" in page
    assert "<h1>sft · m on runs/warmup" in page


def test_a_folder_that_is_no_run_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a training run folder"):
        run_html(tmp_path)


def test_a_record_without_an_episode_is_one_line(run: Path) -> None:
    with (run / "rollouts.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "episode": {"segments": [{"author": "critic"}]}}) + "\n")
    with pytest.raises(UserError, match="no readable episode"):
        run_html(run)


def test_write_run_html_makes_the_folder(run: Path, tmp_path: Path) -> None:
    out = write_run_html(run, tmp_path / "pages" / "run.html")
    assert out == tmp_path / "pages" / "run.html"
    assert out.read_text(encoding="utf-8") == run_html(run)


# -- the page in a real browser ---------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("/usr/bin/chromium")


def _chromium(page: Path, profile: Path, *args: str) -> str:
    """Headless Chromium on `page` (a file: URL; no network), its stdout."""
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # as root in a container
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *args,
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH or at /usr/bin/chromium")
def test_a_real_runs_page_renders_in_headless_chromium(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from PIL import Image, ImageStat

    from collabrl.train.grpo import train_grpo
    from collabrl.train.resolve import resolve_run
    from tests.train.test_grpo import _config

    out = tmp_path / "run"
    train_grpo(resolve_run(_config(tiny_model_dir, out, eval_data="arith", eval_limit=3)))
    kept = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r["step"] for r in kept} == {1, 2}
    # The last episode kept, as a policy might have written it.
    kept[-1]["episode"]["segments"][0]["text"] = HOSTILE
    (out / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    shown = sum(min(sum(r["step"] == step for r in kept), 4) for step in (1, 2))

    page = write_run_html(out, tmp_path / "run.html")
    dom = _chromium(page, tmp_path / "profile-dom", "--dump-dom")
    assert "<title>grpo · " in dom and "pwned" not in dom.split("</title>")[0]  # no script ran
    assert dom.count('<tr class="step">') == 2
    assert dom.count('class="episode"') == shown
    assert _panels(dom) >= 2 and "<path" in dom
    assert "<td>pass@1</td>" in dom  # the held-out start against trained
    assert "advantage " in dom  # what the rollout log records of TRL's scoring
    assert "&lt;script&gt;document.title" in dom and "<img" not in dom  # text, not elements

    picture = tmp_path / "run.png"
    _chromium(page, tmp_path / "profile-shot", f"--screenshot={picture}", "--window-size=1280,1600")
    image = Image.open(picture).convert("RGB")
    assert image.size == (1280, 1600)
    assert ImageStat.Stat(image.convert("L")).stddev[0] > 20  # not one blank colour
    assert len(image.getcolors(1 << 20) or []) > 50  # text, lines and the curves' colours
