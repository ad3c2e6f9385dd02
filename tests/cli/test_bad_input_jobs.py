"""Bad input to the long jobs, `collab build-warmup relay|rsim|consult|apollo`, `collab filter`,
`collab evolve` and `collab serve`, one table per class of value: each is one `error:`
line and a non-zero exit, before any model loads, and leaves no run folder (nor a
converted model) behind. The scripted servers answer at once, so nothing here loads a
model."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_line_error, collab
from tests.servers import free_port

BASE = {
    "relay": ["build-warmup", "relay", "--data", "arith", "--limit", "1"],
    "rsim": ["build-warmup", "rsim", "--data", "arith", "--limit", "1"],
    "consult": ["build-warmup", "consult", "--data", "arith", "--limit", "1"],
    "apollo": ["build-warmup", "apollo", "--data", "arith", "--limit", "1"],
    "filter": ["filter", "--teacher", "reference", "--data", "arith", "--limit", "1"],
    "evolve": ["evolve", "arith", "--model", "smollm2-135m", "--limit", "1", "--rounds", "1"],
    "serve": ["serve", "expert", "--engine", "transformers"],
}


BATCH = "--batch-size: engine.batch_size must be at least 1"
TEMPERATURE = "--temperature: sampling.temperature must be a finite number >= 0, got "
NO_WEIGHTS = "'{config_only}' has a config.json but no weights"
NOT_A_MODEL = "'{empty}' is not a model"
OTHER_RUN = "{} holds another command's run: its config.yaml is not this command's"


def case(command: str, *args: str, error: str) -> pytest.param:
    """One row of a table: the command with `args` (`{name}` fills in an input below)
    must fail with one line holding `error`."""
    return pytest.param([*BASE[command], *args], error, id=f"{command} {' '.join(args)}")


def refused(args: list[str], error: str, cwd: Path, inputs: dict[str, str]) -> None:
    """Run `collab ARGS` in the empty `cwd`: one line holding `error`, nothing left there
    (no run folder under runs/, no model converted into COLLABRL_HOME)."""
    filled = [arg.format(**inputs) for arg in args]
    result = collab(*filled, cwd=cwd, env={"COLLABRL_HOME": str(cwd / "home")})
    assert_one_line_error(result, error.format(**inputs))
    assert list(cwd.iterdir()) == []


class Garbage(BaseHTTPRequestHandler):
    """An OpenAI-compatible server in its model list only; its answers, by the first part
    of the path: `bytes` (not UTF-8), `html` (a web page), `long` (100,000 characters)."""

    def do_GET(self) -> None:
        self._send(json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.path.split("/")[1]
        if mode == "bytes":
            self._send(b'{"choices": [\xff\xfe\x80 not UTF-8')
        elif mode == "html":
            self._send("<html>a proxy's login page</html>", "text/html")
        else:
            message = {"role": "assistant", "content": "x" * 100_000}
            choice = {"index": 0, "finish_reason": "stop", "message": message}
            self._send(json.dumps({"id": "c", "object": "chat.completion", "choices": [choice]}))

    def _send(self, body: str | bytes, kind: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def garbage_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def inputs(
    tmp_path_factory: pytest.TempPathFactory, garbage_url: str, tiny_model_dir: Path
) -> dict[str, str]:
    """Bad inputs outside the working directory: model folders without weights, a
    missing file, URLs no server answers and the garbage server's (and the tiny model,
    whose tokenizer a served policy names)."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "empty").mkdir()
    (root / "config-only").mkdir()
    (root / "config-only" / "config.json").write_text('{"model_type": "llama"}')
    return {
        "empty": str(root / "empty"),
        "config_only": str(root / "config-only"),
        "missing": str(root / "missing.jsonl"),
        "down": f"http://127.0.0.1:{free_port()}/v1",
        "bytes": f"{garbage_url}/bytes/v1",
        "html": f"{garbage_url}/html/v1",
        "long": f"{garbage_url}/long/v1",
        "tiny": str(tiny_model_dir),
    }


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    (tmp_path / "cwd").mkdir()
    return tmp_path / "cwd"


# --- zero and negative ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case("relay", "--batch-size", "0", error=BATCH),
        case("rsim", "--batch-size", "-1", error=BATCH),
        case("consult", "--batch-size", "0", error=BATCH),
        case("apollo", "--batch-size", "0", error=BATCH),
        case(
            "apollo",
            "--samples-per-problem",
            "0",
            error="--samples-per-problem: samples_per_problem must be between 1",
        ),
        case("apollo", "--set", "apollo.tools=[]", error="the apollo protocol has no tools"),
        case("filter", "--batch-size", "0", error=BATCH),
        case("evolve", "--batch-size", "0", error=BATCH),
        case("serve", "--batch-size", "0", error=BATCH),
        case("relay", "--insertions", "0", error="--insertions: insertions must be between 1 and"),
        case("relay", "--limit", "0", error="--limit must be >= 1, got 0"),
        case("rsim", "--rows", "0", error="--rows: rows must be between 1 and 1000000, got 0"),
        case("consult", "--num-experts", "0", error="--num-experts: num_experts must be between 1"),
        case("filter", "--k", "-1", error="--k: k must be between 1 and 1024, got -1"),
        case("filter", "--limit", "0", error="--limit: limit must be at least 1"),
        case("evolve", "--rounds", "0", error="--rounds: rounds must be between 1 and 100, got 0"),
        case("evolve", "--max-tokens", "-5", error="--max-tokens: sampling.max_tokens must be"),
        case("serve", "--port", "0", error="--port: port must be a TCP port, 1-65535, got 0"),
    ],
)
def test_zero_and_negative(args: list[str], error: str, cwd: Path, inputs: dict) -> None:
    refused(args, error, cwd, inputs)


# --- NaN and infinity ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case("relay", "--temperature", "nan", error=TEMPERATURE + "nan"),
        case("rsim", "--temperature", "inf", error=TEMPERATURE + "inf"),
        case(
            "consult",
            "--call-fraction",
            "nan",
            error="--call-fraction: call_fraction must be in [0, 1], got nan",
        ),
        case(
            "filter",
            "--threshold",
            "nan",
            error="--threshold: threshold must be in [0, 1], got nan",
        ),
        case(
            "filter",
            "--set",
            "timeout=.inf",
            error="timeout must be a finite number of seconds > 0, got inf",
        ),
        case("evolve", "--temperature", "nan", error=TEMPERATURE),
        case(
            "serve",
            "--set",
            "batch_wait_ms=.nan",
            error="batch_wait_ms must be between 0 and 60000 ms, got nan",
        ),
    ],
)
def test_nan_and_infinity(args: list[str], error: str, cwd: Path, inputs: dict) -> None:
    refused(args, error, cwd, inputs)


# --- huge ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case(
            "relay",
            "--responses-per-problem",
            "100000000",
            error="--responses-per-problem: responses_per_problem must be between 1 and 1024,",
        ),
        case(
            "relay",
            "--insertions",
            "100000000",
            error="--insertions: insertions must be between 1 and sampling.max_tokens (1024)",
        ),
        case(
            "relay",
            "--max-tokens",
            "99999999999",
            error="--max-tokens: sampling.max_tokens must be between 1 and 2147483647",
        ),
        case(
            "rsim",
            "--samples-per-problem",
            "100000000",
            error="--samples-per-problem: samples_per_problem must be between 1 and 1024",
        ),
        case("rsim", "--rows", "100000000000", error="--rows: rows must be between 1 and 1000000"),
        case(
            "consult",
            "--num-experts",
            "100000000",
            error="--num-experts: num_experts must be between 1 and 1024",
        ),
        case("filter", "--k", "100000000", error="--k: k must be between 1 and 1024"),
        case(
            "filter",
            "--seed",
            "99999999999",
            error="--seed: sampling.seed must be between 0 and 2147483647",
        ),
        case("evolve", "--rounds", "100000000", error="--rounds: rounds must be between 1 and 100"),
        case(
            "evolve",
            "--branches",
            "100000",
            error="--branches: sampling.n must be between 1 and 1024",
        ),
        case(
            "serve", "--port", "70000", error="--port: port must be a TCP port, 1-65535, got 70000"
        ),
    ],
)
def test_huge(args: list[str], error: str, cwd: Path, inputs: dict) -> None:
    refused(args, error, cwd, inputs)


# --- wrong type ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case("relay", "--limit", "abc", error="Invalid value for '--limit'"),
        case("rsim", "--set", "rows=[1]", error="config key 'rows' must be int"),
        case(
            "consult",
            "--set",
            "call_fraction=lots",
            error="config key 'call_fraction' must be float",
        ),
        case("filter", "--k", "1.5", error="Invalid value for '--k'"),
        case("evolve", "--rounds", "two", error="Invalid value for '--rounds'"),
        case("serve", "--port", "http", error="Invalid value for '--port'"),
    ],
)
def test_wrong_type(args: list[str], error: str, cwd: Path, inputs: dict) -> None:
    refused(args, error, cwd, inputs)


# --- missing file --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case("relay", "--data", "{missing}", error="unknown benchmark '{missing}'"),
        case("relay", "--model", "{missing}", error="unknown model '{missing}'"),
        case("rsim", "--data", "{missing}", error="unknown benchmark '{missing}'"),
        case("consult", "--data", "{missing}", error="unknown benchmark '{missing}'"),
        case("filter", "--data", "{missing}", error="unknown benchmark '{missing}'"),
        case("filter", "--teacher", "{missing}", error="unknown model '{missing}'"),
        pytest.param(
            ["evolve", "{missing}", "--model", "smollm2-135m"],
            "unknown benchmark '{missing}'",
            id="evolve {missing}",
        ),
        case("serve", "--model", "{missing}", error="unknown model '{missing}'"),
        case("serve", "--config", "{missing}", error="cannot read config {missing}"),
    ],
)
def test_missing_file(args: list[str], error: str, cwd: Path, inputs: dict) -> None:
    refused(args, error, cwd, inputs)


# --- wrong kind of folder ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case("relay", "--model", "{empty}", error=NOT_A_MODEL),
        case("relay", "--tokenizer", "{empty}", error=NOT_A_MODEL),
        case("rsim", "--model", "{config_only}", error=NO_WEIGHTS),
        case("rsim", "--data", "{empty}", error="{empty} is not a saved Hugging Face dataset"),
        case("consult", "--model", "{config_only}", error=NO_WEIGHTS),
        case("apollo", "--model", "{config_only}", error=NO_WEIGHTS),
        case("filter", "--teacher", "{config_only}", error=NO_WEIGHTS),
        case("filter", "--teacher", "{empty}", error=NOT_A_MODEL),
        case("evolve", "--model", "{config_only}", error=NO_WEIGHTS),
        case("evolve", "--verifier", "{empty}", error=NOT_A_MODEL),
        case("evolve", "--protocol", "solo", "--tokenizer", "{empty}", error=NOT_A_MODEL),
        case("serve", "--model", "{config_only}", error=NO_WEIGHTS),
        case("serve", "--model", "{empty}", error=NOT_A_MODEL),
    ],
)
def test_model_folder_without_weights(args: list[str], error: str, cwd: Path, inputs: dict) -> None:
    refused(args, error, cwd, inputs)


# Another command's run folder, as that command leaves it: its config and a first record.
COMMAND_OF = {"train": "train-grpo", "eval": "eval", "relay": "build-warmup-relay"}
RECORD_OF = {"train": "metrics.jsonl", "eval": "samples.jsonl", "relay": "rows.jsonl"}


@pytest.fixture(scope="module")
def saved_configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The config.yaml of another command's run, as `collab config show` writes it."""
    where = tmp_path_factory.mktemp("configs")
    shown = {name: collab("config", "show", name, cwd=where) for name in COMMAND_OF.values()}
    assert all(result.returncode == 0 for result in shown.values())
    return {name: result.stdout for name, result in shown.items()}


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case(
            "evolve",
            "--resume",
            "--out",
            "{train}",
            error=OTHER_RUN.format("{train}") + " (EvolveConfig: unknown config key",
        ),
        case("relay", "--out", "{train}", error=OTHER_RUN.format("{train}")),
        case("rsim", "--out", "{eval}", error=OTHER_RUN.format("{eval}")),
        case("consult", "--out", "{relay}", error=OTHER_RUN.format("{relay}")),
        case("filter", "--out", "{eval}", error=OTHER_RUN.format("{eval}")),
    ],
)
def test_another_commands_run_folder_is_kept_as_it_was(
    args: list[str], error: str, cwd: Path, inputs: dict, saved_configs: dict, tmp_path: Path
) -> None:
    folders = {}
    for kind, command in COMMAND_OF.items():
        folder = tmp_path / f"{kind}-run"
        folder.mkdir()
        (folder / "config.yaml").write_text(saved_configs[command])
        (folder / RECORD_OF[kind]).write_text('{"step": 1}\n')
        folders[kind] = str(folder)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    refused(args, error, cwd, inputs | folders)

    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_damaged_evolve_state_is_one_line(cwd: Path, inputs: dict, tmp_path: Path) -> None:
    out = tmp_path / "evolve-run"
    out.mkdir()
    (out / "state.json").write_text('{"rounds": [')
    args = [*BASE["evolve"], "--resume", "--out", str(out)]
    refused(args, f"{out}/state.json is not an evolve state", cwd, inputs)


# --- unreachable or garbage URL ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case(
            "relay", "--model", "{down}", "--tokenizer", "smollm2-135m", error="cannot reach {down}"
        ),
        case(
            "relay",
            "--model",
            "{down}",
            error="the relay warm-up of a policy at a URL ({down}) needs its tokenizer",
        ),
        case("rsim", "--model", "{down}", error="cannot reach {down}"),
        case(
            "consult",
            "--model",
            "http://256.256.256.256/v1",
            error="base URL 'http://256.256.256.256/v1' is not a valid http(s) URL",
        ),
        case("filter", "--teacher", "{down}", error="cannot reach {down}"),
        case("filter", "--teacher", "http://teacher:port/v1", error="is not a valid http(s) URL"),
        case(
            "evolve",
            "--model",
            "{down}",
            "--tokenizer",
            "{tiny}",
            error="cannot reach {down}",
        ),
        case("evolve", "--verifier", "{down}", error="cannot reach {down}"),
        case(
            "serve",
            "--model",
            "{down}",
            error="collab serve serves a local model, not the endpoint {down}",
        ),
        case("serve", "--host", "999.1.1.1", error="cannot listen on 999.1.1.1:8000"),
    ],
)
def test_unreachable_or_garbage_url(args: list[str], error: str, cwd: Path, inputs: dict) -> None:
    refused(args, error, cwd, inputs)


NOT_OPENAI = "answered with something that is not an OpenAI-compatible response"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        case("rsim", "--model", "{bytes}", error=f"{{bytes}} {NOT_OPENAI} (UnicodeDecodeError"),
        case(
            "consult",
            "--model",
            "{html}",
            "--tokenizer",  # a served policy's rows are rendered with its chat template
            "{tiny}",
            error=f"{{html}} {NOT_OPENAI} (ValueError: no list of choices",
        ),
        # Its rows are rendered with the policy's chat template.
        case("consult", "--model", "{long}", error="pass --tokenizer with a local reference"),
        case(
            "filter",
            "--teacher",
            "{bytes}",
            "--k",
            "2",
            error=f"every teacher call failed (2), the first with: {{bytes}} {NOT_OPENAI}",
        ),
        pytest.param(
            ["evolve", "arith", "--model", "{bytes}", "--protocol", "solo", "--limit", "1"],
            f"{{bytes}} {NOT_OPENAI}",
            id="evolve --model {bytes}",
        ),
        pytest.param(
            [
                "evolve",
                "arith",
                "--model",
                "{long}",
                "--protocol",
                "solo",
                "--limit",
                "1",
                "--max-tokens",
                "8",
            ],
            "(ValueError: 100000 characters for at most 8 tokens)",
            id="evolve --model {long}",
        ),  # fmt: skip
    ],
)
def test_a_server_answering_garbage(args: list[str], error: str, cwd: Path, inputs: dict) -> None:
    refused(args, error, cwd, inputs)


# --- a problem too big to sample -----------------------------------------------------------------


def test_an_oversized_problem_is_skipped_with_a_note(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    rows = [
        {"id": "huge", "problem": "What is " + "1 + " * 50_000 + "1?", "answer": "50001"},
        {"id": "small", "problem": "What is 2 + 3?", "answer": "5"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"

    result = collab(
        *BASE["filter"], "--data", str(data), "--limit", "2", "--out", str(out), cwd=tmp_path
    )

    assert result.returncode == 0, result.stderr
    assert "note: 1 problems skipped, each over 100000 characters" in result.stdout
    assert json.loads((out / "stats.json").read_text())["oversized"] == 1
    assert [json.loads(line)["id"] for line in (out / "rows.jsonl").read_text().splitlines()] == [
        "small"
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "{huge}", "--model", "smollm2-135m", "--limit", "1"],
        ["infer", "solo", "--bench", "{huge}", "--model", "smollm2-135m"],
        ["evolve", "{huge}", "--model", "smollm2-135m", "--protocol", "solo"],
        ["train", "grpo", "--data", "{huge}", "--steps", "1"],
        ["train", "grpo", "--data", "arith_train", "--eval-data", "{huge}", "--steps", "1"],
    ],
    ids=lambda args: " ".join(args[:2]) + (" --eval-data" if "--eval-data" in args else ""),
)
def test_an_oversized_problem_is_refused_where_no_row_may_be_skipped(
    args: list[str], cwd: Path, tmp_path: Path
) -> None:
    """Eval, infer, evolve and train score or learn every row: one over the bound is
    refused before any model loads, naming its line."""
    huge = tmp_path / "huge.jsonl"
    rows = [
        {"id": "small", "problem": "What is 2 + 3?", "answer": "5"},
        {"id": "huge", "problem": "What is " + "1 + " * 50_000 + "1?", "answer": "50001"},
    ]
    huge.write_text("".join(json.dumps(r) + "\n" for r in rows))
    refused(args, f"{huge}:2: the problem row is 200,015 characters", cwd, {"huge": str(huge)})


@pytest.mark.parametrize(
    "args",
    [
        ["infer", "relay", "--bench", "arith", "--teacher", "reference@2"],
        ["eval", "arith", "--protocol", "consult", "--expert", "reference@x", "--limit", "1"],
        ["train", "relay", "--teacher", "reference@1.5", "--data", "arith_train", "--steps", "1"],
        ["filter", "--teacher", "reference@-1", "--data", "arith", "--limit", "1"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_a_stand_in_with_an_impossible_accuracy_is_refused(args: list[str], cwd: Path) -> None:
    refused(args, "a stand-in's accuracy is a number from 0 to 1", cwd, {})


# --- hostile configs and data files (issue 33) ---------------------------------------------------

# Nine anchors, each aliasing the one before nine times: 9^9 values in ~300 bytes, which every
# reader after the parser (the copies, the dry run's listing) would expand, in a key that
# takes any value.
LAUGHS = "engine:\n  chat_template_kwargs:\n    a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"    {b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
TRAIN = ["train", "grpo", "--model", "{tiny}", "--data", "arith_train", "--steps", "1"]


@pytest.mark.parametrize(
    ("args", "content", "error"),
    [
        ([*TRAIN, "--dry-run", "--config", "{file}"], LAUGHS, "{file}:8 is not valid YAML"),
        # Each of these is also read in-process by tests/test_config.py; through the CLI (a
        # start of ~5 s each) they run with the slow tests.
        pytest.param(
            [*TRAIN, "--config", "{file}"],
            "sampling:\n\tn: 4\n",
            "{file}:2 is not valid YAML",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            [*TRAIN, "--config", "{file}"],
            None,
            "cannot read config {file}: not a regular file",
            marks=pytest.mark.slow,
        ),
        ([*TRAIN, "--data", "{file}"], None, "cannot read data file {file}: not a regular file"),
        pytest.param(
            [*TRAIN, "--dry-run", "--set", "a." * 3000 + "b=1"],
            "",
            "3001 levels deep",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["billion laughs", "tab", "fifo config", "fifo data", "deep --set"],
)
def test_a_hostile_config_or_data_file_is_one_line(
    args: list[str], content: str | None, error: str, cwd: Path, inputs: dict, tmp_path: Path
) -> None:
    file = tmp_path / "hostile.jsonl"
    if content is None:
        os.mkfifo(file)  # opening it would wait for a writer forever
    else:
        file.write_text(content)
    refused(args, error, cwd, inputs | {"file": str(file)})


# --- readers never write (issue 33) --------------------------------------------------------------


def _episode_record(step: int) -> dict:
    episode = {"problem_id": "p", "prompt_ids": [1, 2], "segments": [], "answer": "5", "end": "eos"}
    return {"step": step, "correct": True, "gold": "5", "episode": episode}


@pytest.mark.parametrize(
    ("tail", "steps"),
    [(b'{"step": 2, "epis', "step 1 · "), (json.dumps(_episode_record(2)).encode(), "step 2 · ")],
    ids=["torn", "unended"],
)
def test_train_rollouts_on_a_live_run_reads_without_writing(
    tmp_path: Path, tail: bytes, steps: str
) -> None:
    (tmp_path / "run").mkdir()
    rollouts = tmp_path / "run" / "rollouts.jsonl"
    rollouts.write_bytes(json.dumps(_episode_record(1)).encode() + b"\n" + tail)

    result = collab("train", "rollouts", "run", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert steps in result.stdout
    assert rollouts.read_bytes() == json.dumps(_episode_record(1)).encode() + b"\n" + tail
    assert result.stderr.count("cut short") == (tail.startswith(b'{"step": 2, "epis'))


def test_eval_report_on_a_live_run_reads_without_writing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text('{"samples_per_problem": 1, "problems": 2}')
    samples = b"".join(
        json.dumps({"item_id": f"g{i}-x", "sample": 0, "correct": True}).encode() + b"\n"
        for i in (1, 2)
    )
    (run / "samples.jsonl").write_bytes(samples + b'{"item_id": "g3-')

    result = collab("eval", "report", "run", "--by", "(g\\d)-", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "g1" in result.stdout and "g2" in result.stdout and "g3" not in result.stdout
    assert (run / "samples.jsonl").read_bytes() == samples + b'{"item_id": "g3-'
    assert result.stderr.count("cut short") == 1


# --- resume: a broken checkpoint, nothing to resume (issue 33) -----------------------------------


def test_train_resume_from_a_broken_checkpoint_names_it_and_the_one_before(
    cwd: Path, inputs: dict
) -> None:
    from tests.train.test_run import write_checkpoint

    write_checkpoint(cwd / "run" / "checkpoints", 1)
    broken = write_checkpoint(cwd / "run" / "checkpoints", 2)
    (broken / "trainer_state.json").write_text('{"global_step": 2, "log_hi')
    before = {p: p.read_bytes() for p in cwd.rglob("*") if p.is_file()}
    args = [*TRAIN, "--steps", "4", "--resume", "--out", "run"]

    result = collab(*[a.format(**inputs) for a in args], cwd=cwd)

    line = assert_one_line_error(result, "checkpoint run/checkpoints/checkpoint-2 is broken")
    assert "resume from checkpoint-1, the one before it" in line
    assert {p: p.read_bytes() for p in cwd.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    ("out", "error"),
    [
        (["--out", "{missing}"], "no evolve run to resume in {missing}"),
        ([], "--resume needs --out"),
    ],
    ids=["empty folder", "no --out"],
)
def test_evolve_resume_with_nothing_to_resume_is_refused(
    out: list[str], error: str, cwd: Path, inputs: dict
) -> None:
    refused([*BASE["evolve"], "--resume", *out], error, cwd, inputs)


# --- collaborators that cannot work, in eval (issue 33) ----------------------------------------

EVAL = ["eval", "arith", "--limit", "1", "--out", "O"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--engine", "bogus"], "--engine: engine.kind must be one of auto, transformers"),
        (["--set", "engine.timeout=-1"], "engine.timeout must be a finite number > 0, got -1.0"),
        (["--protocol", "relay", "--teacher", "{down}"], "cannot reach {down}"),
        (["--protocol", "consult", "--expert", "no-such-expert"], "unknown model 'no-such-expert'"),
        (["--protocol", "relay", "--teacher", "Reference@0.5"], "written in lower case"),
        (["--protocol", "consult", "--expert", "REFERENCE"], "written in lower case"),
        (["--judge", "{down}"], "cannot reach {down}"),
        (["--judge", "my-judge"], "--judge: judge 'my-judge' is not a base URL"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_eval_refuses_a_collaborator_that_cannot_work(
    args: list[str], error: str, cwd: Path, inputs: dict
) -> None:
    refused([*EVAL, *args], error, cwd, inputs)  # O/config.yaml is not written either
