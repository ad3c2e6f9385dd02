"""Tests for comparing finished runs (`collab eval report`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collabrl import runs
from collabrl.config import save_config
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.metrics import pass_at_k
from collabrl.eval.report import (
    curve_labels,
    format_p,
    group_rows,
    load_run,
    pass_curve,
    plot_pass_at_k,
    report_rows,
    run_names,
    to_markdown,
)


def _run(
    folder: Path, model: str, n: int, metrics: dict, benchmark: str = "aime24", protocol="solo"
) -> Path:
    folder.mkdir(parents=True)
    config = EvalConfig(benchmark=benchmark, model=model)
    config.protocol.name = protocol
    config.sampling.n = n
    config.sampling.temperature = 0.6
    save_config(config, folder / runs.CONFIG)
    body = {"problems": 30.0, "samples_per_problem": float(n), **metrics}
    runs.write_json(folder / runs.METRICS, body)
    return folder


@pytest.fixture
def two_runs(tmp_path: Path) -> list[Path]:
    first = _run(
        tmp_path / "run-a",
        "smollm2-135m",
        1,
        {
            "pass@1": 0.1,
            "avg@1": 0.1,
            "maj@1": 0.1,
            "f1@1": 0.25,
            "var": 0.09,
            "stderr": 0.0557,
            "call_ratio": 0.0,
        },
    )
    second = _run(
        tmp_path / "run-b",
        "/models/qwen",
        4,
        {
            "pass@1": 0.3,
            "pass@4": 0.5,
            "avg@4": 0.3,
            "maj@4": 0.4,
            "f1@4": 0.45,
            "var": 0.12,
            "stderr": 0.06,
            "call_ratio": 0.125,
        },
    )
    return [first, second]


def test_load_run_reads_identity_and_metrics(two_runs: list[Path]) -> None:
    run = load_run(two_runs[1])
    assert run["run"] == str(two_runs[1])
    assert run["benchmark"] == "aime24"
    assert run["model"] == "/models/qwen"
    assert run["protocol"] == "solo"
    assert run["n"] == 4
    assert run["temperature"] == 0.6
    assert run["metrics"]["pass@4"] == 0.5


def test_report_rows_line_up_metrics_of_different_n(two_runs: list[Path]) -> None:
    header, rows = report_rows([load_run(r) for r in two_runs])
    assert header == [
        "run",
        "model",
        "protocol",
        "benchmark",
        "n",
        "problems",
        "pass@1",
        "pass@4",  # every pass@k some run has: the other's cell is "-"
        "avg@n",
        "maj@n",
        "f1@n",
        "var",
        "stderr",
        "call_ratio",
    ]
    assert rows[0] == [
        "run-a",
        "smollm2-135m",
        "solo",
        "aime24",
        "1",
        "30",
        "0.1000",
        "-",
        "0.1000",
        "0.1000",
        "0.2500",
        "0.0900",
        "0.0557",
        "0.0000",
    ]
    assert rows[1] == [
        "run-b",
        "/models/qwen",
        "solo",
        "aime24",
        "4",
        "30",
        "0.3000",
        "0.5000",
        "0.3000",
        "0.4000",
        "0.4500",
        "0.1200",
        "0.0600",
        "0.1250",
    ]


def test_metrics_missing_from_every_run_get_no_column(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", "m", 2, {"pass@1": 0.5, "avg@2": 0.5})
    header, rows = report_rows([load_run(run)])
    assert header[6:] == ["pass@1", "avg@n"]
    assert rows[0][6:] == ["0.5000", "0.5000"]


def test_a_metric_one_run_lacks_shows_a_dash(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", "m", 2, {"pass@1": 0.5, "avg@2": 0.5, "maj@2": 1.0})
    b = _run(tmp_path / "b", "m", 2, {"pass@1": 0.5, "avg@2": 0.5})
    header, rows = report_rows([load_run(a), load_run(b)])
    column = header.index("maj@n")
    assert rows[0][column] == "1.0000"
    assert rows[1][column] == "-"


def test_markdown_table(two_runs: list[Path]) -> None:
    header, rows = report_rows([load_run(r) for r in two_runs])
    lines = to_markdown(header, rows).splitlines()
    assert len(lines) == 4
    assert lines[0] == "| " + " | ".join(header) + " |"
    assert lines[1] == "|" + "---|" * len(header)
    assert lines[2].startswith("| run-a | smollm2-135m | solo | aime24 | 1 | 30 | 0.1000 |")
    assert all(line.count("|") == len(header) + 1 for line in lines)


def test_run_without_config_still_reports(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    runs.write_json(
        folder / runs.METRICS, {"problems": 2.0, "samples_per_problem": 2.0, "avg@2": 0.25}
    )
    run = load_run(folder)
    assert (run["benchmark"], run["model"], run["protocol"], run["n"]) == ("?", "?", "?", 2)
    _, rows = report_rows([run])
    assert rows[0][-1] == "0.2500"


def test_missing_metrics_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        load_run(tmp_path)
    assert "has no metrics.json nor results.json" in info.value.problem
    assert str(tmp_path) in info.value.problem


def test_corrupt_metrics_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / runs.METRICS).write_text('{"pass@1": 0.')
    with pytest.raises(UserError, match="not valid JSON"):
        load_run(tmp_path)


def test_report_of_a_real_run(tiny_model_dir, tiny_engine, tmp_path: Path) -> None:
    from collabrl.config import build_config
    from collabrl.eval.runner import run_eval

    out = tmp_path / "real"
    config = build_config(
        EvalConfig,
        [
            {
                "benchmark": "aime24",
                "model": str(tiny_model_dir),
                "limit": 2,
                "out": str(out),
                "sampling": {"n": 2, "max_tokens": 4},
            }
        ],
    )
    result = run_eval(config, engine=tiny_engine)
    run = load_run(out)
    assert run["n"] == 2 and run["model"] == str(tiny_model_dir)
    header, rows = report_rows([run])
    assert {"pass@1", "avg@n", "maj@n", "f1@n", "var", "stderr", "call_ratio"} <= set(header)
    stderr = run["metrics"]["avg@2_stderr"]
    assert rows[0][header.index("avg@n")] == f"{result.metrics['avg@2']:.4f} ± {stderr:.4f}"
    assert rows[0][header.index("problems")] == "2"
    # results.json's metrics: metrics.json's, each mean with its standard error beside it.
    saved = json.loads((out / runs.METRICS).read_text())
    assert {k: v for k, v in run["metrics"].items() if not k.endswith("_stderr")} == saved
    assert run["metrics"]["pass@1_stderr"] >= 0.0
    # The curve from the samples is the pass@k that the run summarized.
    assert pass_curve(run) == [(k, pytest.approx(result.metrics[f"pass@{k}"])) for k in (1, 2)]


# --- what is and is not a run --------------------------------------------------------------------


def test_protocol_labels_the_row(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", "m", 1, {"pass@1": 0.5}, benchmark="math500", protocol="relay")
    header, rows = report_rows([load_run(run)])
    cells = dict(zip(header, rows[0], strict=True))
    assert (cells["model"], cells["protocol"], cells["benchmark"]) == ("m", "relay", "math500")


def test_a_file_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UserError, match="is not a folder"):
        load_run(tmp_path / "notes.txt")


@pytest.mark.parametrize("body", ['{"pass@1": 0.5}', "[1, 2]", '"text"'])
def test_metrics_not_written_by_eval_are_refused(tmp_path: Path, body: str) -> None:
    (tmp_path / runs.METRICS).write_text(body)
    with pytest.raises(UserError, match="not written by `collab eval`"):
        load_run(tmp_path)


def test_runs_are_named_by_as_much_path_as_tells_them_apart(tmp_path: Path) -> None:
    a = _run(tmp_path / "suite-a" / "aime24", "m", 1, {"pass@1": 0.5})
    b = _run(tmp_path / "suite-b" / "aime24", "m", 1, {"pass@1": 0.5})
    c = _run(tmp_path / "suite-b" / "math500", "m", 1, {"pass@1": 0.5})
    loaded = [load_run(r) for r in (a, b, c)]
    assert run_names(loaded) == ["suite-a/aime24", "suite-b/aime24", "suite-b/math500"]
    assert run_names([loaded[0], loaded[2]]) == ["aime24", "math500"]
    assert run_names([loaded[0], loaded[0]]) == ["aime24", "aime24"]  # one run twice
    _, rows = report_rows(loaded)
    assert [row[0] for row in rows] == ["suite-a/aime24", "suite-b/aime24", "suite-b/math500"]


# --- pass@k curves -------------------------------------------------------------------------------


def _samples(folder: Path, correct: dict[str, list[bool]]) -> None:
    lines = [
        json.dumps({"item_id": item, "sample": i, "correct": ok})
        for item, oks in correct.items()
        for i, ok in enumerate(oks)
    ]
    (folder / runs.SAMPLES).write_text("\n".join(lines) + "\n")


def test_pass_curve_is_the_unbiased_estimator_over_the_samples(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", "m", 5, {})
    _samples(run, {"p1": [True, False, False, False, False], "p2": [False] * 5, "p3": [True] * 5})
    curve = pass_curve(load_run(run))
    assert [k for k, _ in curve] == [1, 2, 4, 5]  # k on a log2 axis, and n itself
    for k, value in curve:
        expected = (pass_at_k(5, 1, k) + pass_at_k(5, 0, k) + pass_at_k(5, 5, k)) / 3
        assert value == pytest.approx(expected)
    assert curve[0][1] == pytest.approx((0.2 + 0 + 1) / 3)
    assert curve[-1][1] == pytest.approx(2 / 3)


def test_pass_curve_skips_problems_still_missing_samples(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", "m", 2, {})
    _samples(run, {"done": [True, False], "half": [True]})
    assert pass_curve(load_run(run)) == [(1, 0.5), (2, 1.0)]


def test_pass_curve_without_samples_is_a_user_error(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", "m", 2, {})
    with pytest.raises(UserError, match="has no problem with all its 2 samples"):
        pass_curve(load_run(run))


def test_curve_labels_name_model_protocol_and_benchmark(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", "/models/Qwen2.5-7B/", 1, {}, protocol="relay")
    b = _run(tmp_path / "b", "http://host:8000/v1", 1, {}, benchmark="math500")
    c = _run(tmp_path / "c", "http://host:8000/v1", 1, {}, benchmark="math500")
    assert curve_labels([load_run(a), load_run(b)]) == [
        "Qwen2.5-7B · relay · aime24",
        "http://host:8000/v1 · solo · math500",
    ]
    assert curve_labels([load_run(b), load_run(c)]) == [
        "http://host:8000/v1 · solo · math500 (b)",
        "http://host:8000/v1 · solo · math500 (c)",
    ]


@pytest.mark.parametrize(("name", "magic"), [("curves.png", b"\x89PNG"), ("curves.pdf", b"%PDF")])
def test_plot_is_written_in_the_suffix_format(tmp_path: Path, name: str, magic: bytes) -> None:
    one = _run(tmp_path / "one", "m", 1, {})
    four = _run(tmp_path / "four", "m", 4, {}, protocol="relay")
    _samples(one, {"p": [True], "q": [False]})
    _samples(four, {"p": [True, False, False, True], "q": [False] * 4})
    plot_pass_at_k([load_run(one), load_run(four)], tmp_path / name)
    assert (tmp_path / name).read_bytes().startswith(magic)


@pytest.mark.parametrize(
    ("target", "problem"),
    [("curves.xyz", "does not end in .png, .pdf, .svg"), ("nowhere/curves.png", "No such file")],
)
def test_an_unwritable_plot_is_a_user_error(tmp_path: Path, target: str, problem: str) -> None:
    run = _run(tmp_path / "r", "m", 1, {})
    _samples(run, {"p": [True]})
    with pytest.raises(UserError, match="--plot|cannot write the plot") as info:
        plot_pass_at_k([load_run(run)], tmp_path / target)
    assert problem in info.value.problem and "\n" not in str(info.value)


def test_groups_are_the_captures_of_by_in_the_ids_with_what_their_samples_did(
    tmp_path: Path,
) -> None:
    folder = _run(tmp_path / "relay", "policy", 2, {"pass@1": 0.5}, protocol="relay")
    samples = [  # (item, sample, correct, calls, teacher tokens, all tokens)
        ("arith-test-add1-0000", 0, True, 0, 0, 10),
        ("arith-test-add1-0000", 1, True, 1, 5, 10),
        ("arith-test-mul22-0000", 0, True, 2, 8, 10),
        ("arith-test-mul22-0000", 1, False, 0, 0, 10),
        ("other-0", 0, False, 0, 0, 0),
        ("other-0", 1, False, 0, 0, 0),
    ]
    keys = ("item_id", "sample", "correct", "calls", "helper_tokens", "completion_tokens")
    lines = [json.dumps(dict(zip(keys, sample, strict=True))) for sample in samples]
    (folder / runs.SAMPLES).write_text("\n".join(lines) + "\n")

    header, rows = group_rows([load_run(folder)], r"arith-\w+-(\w+)-")

    by_group = {row[1]: dict(zip(header, row, strict=True)) for row in rows}
    assert by_group["add1"] | {"run": "relay"} == {
        "run": "relay", "group": "add1", "samples": "2", "accuracy": "1.0000",
        "alone": "0.5000", "calling": "0.5000", "calls": "0.5000", "call_ratio": "0.2500",
        "helper_tokens": "2.5000",
    }  # fmt: skip
    assert by_group["mul22"]["alone"] == "0.0000" and by_group["mul22"]["calls"] == "1.0000"
    assert by_group["(other)"]["accuracy"] == "0.0000"
    with pytest.raises(UserError, match="captures nothing"):
        group_rows([load_run(folder)], "arith")
    with pytest.raises(UserError, match="is not a regular expression"):
        group_rows([load_run(folder)], "(")


def test_a_small_p_value_keeps_two_significant_digits() -> None:
    # 4 decimals would print 3e-9 as 0.0000, which reads as "exactly zero".
    assert format_p(0.0156) == "0.0156"
    assert format_p(1e-4) == "0.0001"
    assert format_p(3.2e-9) == "3.2e-09"
