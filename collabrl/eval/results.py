"""`results.json`: an eval run's results in one machine-readable file, shaped in the spirit
of lm-eval's (`results`, `higher_is_better`, `n-samples`, `configs`, `config`, `versions`,
`date`), beside the run's `samples.jsonl`.

Every section but `config` and `versions` is keyed by benchmark, so a suite run into one
`--out DIR` gets one `DIR/results.json` holding each benchmark's (`merge_results`), and a
reader treats one benchmark and several alike. `results` holds a benchmark's metrics as
`metrics.json` does, each mean over problems followed by its standard error
(`pass@1`, `pass@1_stderr`, ...: see `metrics.standard_errors`). Unlike lm-eval, `versions`
are the installed packages' (collabrl, torch, transformers, trl, vllm) and `date` is
ISO 8601 in UTC; metrics.json stays beside it, unchanged, for older readers.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.config import to_dict
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.metrics import ks_for
from collabrl.protocols.saved import unread_protocol_keys
from collabrl.redact import redact_config, redact_text
from collabrl.userfiles import read_json

RESULTS = "results.json"
# Bumped when a key of results.json changes meaning; readers refuse a newer one.
RESULTS_FORMAT = 1
# vLLM beside the packages config.yaml's header records: it generates when installed.
VERSIONED = (*runs.RECORDED_PACKAGES, "vllm")
NOT_RESULTS = "pass the run folders of `collab eval` (their results.json)"


def results_document(
    config: EvalConfig,
    name: str,
    metrics: dict[str, Any],
    stderrs: dict[str, float],
    problems: int,
) -> dict[str, Any]:
    """The results.json of one benchmark's run: `metrics` (what metrics.json holds) with
    the standard error of each mean after it, for the `problems` the run planned."""
    n = int(metrics["samples_per_problem"])
    return {
        "format": RESULTS_FORMAT,
        "results": {name: with_stderrs(metrics, stderrs)},
        # Every metric with a standard error is a share of problems solved: higher is better.
        "higher_is_better": {name: dict.fromkeys(stderrs, True)},
        "n-samples": {name: {"effective": problems, "scored": int(metrics["problems"])}},
        "configs": {
            name: {
                "benchmark": config.benchmark,
                "split": config.split,
                "limit": config.limit,
                "prompt": config.prompt,
                "n": n,
                "k": ks_for(n),
                "sampling": to_dict(config.sampling),
            }
        },
        "samples": {name: runs.SAMPLES},
        "model": redact_text(config.model),  # `http://user:pw@host/v1`
        "protocol": config.protocol.name,
        "config": shareable_config(config),
        **_environment(),
    }


def shareable_config(config: EvalConfig) -> dict[str, Any]:
    """`config` as config.yaml holds it (the other protocols' sections left out), with its
    secrets redacted (`collabrl.redact`): results.json is made to be shared, while an API
    key given on the command line stays in config.yaml, which a resumed run reads."""
    return redact_config(to_dict(config, unread_protocol_keys(config.protocol)))


def with_stderrs(metrics: dict[str, Any], stderrs: dict[str, float]) -> dict[str, Any]:
    """`metrics` in their order, each one that has a standard error followed by it."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        out[key] = value
        if key in stderrs:
            out[f"{key}_stderr"] = stderrs[key]
    return out


def _environment() -> dict[str, Any]:
    """What ran the evaluation and when: installed versions, git commit, date."""
    versions = runs.installed_versions(VERSIONED)
    if versions["vllm"] == "not installed":  # an optional engine, not a missing part
        del versions["vllm"]
    return {
        "versions": versions,
        "git_hash": runs.git_commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# The sections keyed by benchmark, merged by a suite's results.json.
BY_BENCHMARK = ("results", "higher_is_better", "n-samples", "configs")


def merge_results(config: EvalConfig, folders: dict[str, Path], out: Path) -> dict[str, Any]:
    """A suite's results.json in `out`, from the results.json of each benchmark's folder
    (under `out`): every benchmark's sections under its name, its samples by their path
    from `out`, and the suite's own config (its benchmark list)."""
    merged: dict[str, Any] = {"format": RESULTS_FORMAT, **{key: {} for key in BY_BENCHMARK}}
    merged["samples"] = {}
    for name, folder in folders.items():
        doc = read_results(folder / RESULTS)
        for key in BY_BENCHMARK:
            merged[key].update(doc[key])
        merged["samples"][name] = str((folder / runs.SAMPLES).relative_to(out))
    merged["model"] = redact_text(config.model)
    merged["protocol"] = config.protocol.name
    merged["config"] = shareable_config(config)
    return merged | _environment()


def read_results(path: Path) -> dict[str, Any]:
    """A results.json, refused in one line unless it has the sections `collab eval`
    writes (each benchmark's metrics a mapping)."""
    doc = read_json(path, "results", "re-run the eval to rewrite it")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict):
        raise UserError(f"{path} was not written by `collab eval` (no results)", NOT_RESULTS)
    if not isinstance(doc.get("format"), int) or doc["format"] > RESULTS_FORMAT:
        raise UserError(
            f"{path} has results format {doc.get('format')!r}; this collabrl reads up to "
            f"{RESULTS_FORMAT}",
            "upgrade collabrl to read it",
        )
    for key in (*BY_BENCHMARK, "samples", "config"):
        if not isinstance(doc.get(key), dict):
            raise UserError(f"{path} has no {key} mapping", NOT_RESULTS)
    for name, metrics in doc["results"].items():
        if not isinstance(metrics, dict) or not isinstance(doc["samples"].get(name), str):
            raise UserError(f"{path}: benchmark {name!r} has no metrics or samples", NOT_RESULTS)
    return doc
