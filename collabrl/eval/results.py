"""`results.json`: an eval run's results in one machine-readable file, shaped in the spirit
of lm-eval's (`results`, `higher_is_better`, `n-shot`, `n-samples`, `configs`,
`task_hashes`, `config`, `versions`, `chat_template`, `date`), beside the run's
`samples.jsonl`.

Every section but `config` and `versions` is keyed by benchmark, so a suite run into one
`--out DIR` gets one `DIR/results.json` holding each benchmark's (`merge_results`), and a
reader treats one benchmark and several alike. `results` holds a benchmark's metrics as
`metrics.json` does, each mean over problems followed by its standard error
(`pass@1`, `pass@1_stderr`, ...: see `metrics.standard_errors`), then the same means under
lm-eval's `metric,filter` keys (`exact_match,none`, `exact_match_stderr,none`, ...) for
lm-eval's readers. `configs` records what a run cannot be reproduced without (the prompt
template with its examples, the data's hash); with the samples' hashes (`task_hashes`)
and the chat template, two runs are told apart by their files alone. Unlike lm-eval,
`versions` are the installed packages' (collabrl, torch, transformers, trl, vllm) and
`date` is ISO 8601 in UTC; metrics.json stays beside it, unchanged, for older readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.config import to_dict
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.metrics import ks_for
from collabrl.eval.provenance import collabrl_commit, digest
from collabrl.models import hub_commit
from collabrl.protocols.saved import unread_protocol_keys
from collabrl.redact import redact_config, redact_text
from collabrl.userfiles import read_json

RESULTS = "results.json"
# Bumped when a key of results.json changes meaning; readers refuse a newer one.
# 2: `configs.<bench>.prompt` is the template used (was the --prompt name), `git_hash`
# collabrl's commit (was the working directory's).
RESULTS_FORMAT = 2
# vLLM beside the packages config.yaml's header records: it generates when installed.
VERSIONED = (*runs.RECORDED_PACKAGES, "vllm")
NOT_RESULTS = "pass the run folders of `collab eval` (their results.json)"


@dataclass(frozen=True)
class Provenance:
    """What a benchmark's run was, beyond its config: what it takes to reproduce it."""

    prompt: dict[str, Any] | None  # the template, its examples included; None: the protocol's
    data_hash: str  # of the rows evaluated (provenance.data_hash)
    fewshot_ids: list[str]  # the examples' row ids, in the order shown
    fewshot_split: str | None  # the registered training set they come from
    task_hash: str | None  # of the samples' hashes (provenance.task_hash)
    chat_template: str | None  # the policy's; None where an endpoint applies its own
    seconds: float | None  # this command's time on the benchmark, sampling and scoring


def results_document(
    config: EvalConfig,
    name: str,
    metrics: dict[str, Any],
    stderrs: dict[str, float],
    problems: int,
    provenance: Provenance,
) -> dict[str, Any]:
    """The results.json of one benchmark's run: `metrics` (what metrics.json holds) with
    the standard error of each mean after it, for the `problems` the run planned."""
    n = int(metrics["samples_per_problem"])
    lm_eval = lm_eval_results(name, metrics, stderrs)
    theirs = {key.split(",")[0] for key in lm_eval if "," in key and "_stderr," not in key}
    higher = dict.fromkeys([*stderrs, *sorted(theirs)], True)
    return {
        "format": RESULTS_FORMAT,
        "results": {name: with_stderrs(metrics, stderrs) | lm_eval},
        # Every metric with a standard error is a share of problems solved: higher is better.
        "higher_is_better": {name: higher},
        "n-shot": {name: config.num_fewshot},
        "n-samples": {name: {"effective": problems, "scored": int(metrics["problems"])}},
        "configs": {name: task_config(config, n, provenance)},
        "task_hashes": {name: provenance.task_hash},
        "samples": {name: runs.SAMPLES},
        "model": redact_text(config.model),  # `http://user:pw@host/v1`
        "model_sha": hub_commit(config.model),  # lm-eval's key; null for a local model
        "protocol": config.protocol.name,
        "config": shareable_config(config),
        "chat_template": provenance.chat_template,
        "chat_template_sha": _sha(provenance.chat_template),
        "total_evaluation_time_seconds": provenance.seconds,
        **_environment(),
    }


def task_config(config: EvalConfig, n: int, provenance: Provenance) -> dict[str, Any]:
    """`configs.<benchmark>`: what was asked of the model and how it was sampled."""
    return {
        "benchmark": config.benchmark,
        "split": config.split,
        "limit": config.limit,
        "data_hash": provenance.data_hash,
        "prompt": provenance.prompt,
        "prompt_hash": None if provenance.prompt is None else digest(provenance.prompt),
        "num_fewshot": config.num_fewshot,
        "fewshot": {
            "split": provenance.fewshot_split,
            "seed": config.fewshot_seed,
            "as_multiturn": config.fewshot_as_multiturn,
            "ids": provenance.fewshot_ids,
        }
        if config.num_fewshot
        else None,
        "n": n,
        "k": ks_for(n),
        "sampling": to_dict(config.sampling),
    }


def lm_eval_results(
    name: str, metrics: dict[str, Any], stderrs: dict[str, float]
) -> dict[str, Any]:
    """The means of `metrics` under lm-eval's `metric,filter` keys, each followed by its
    `metric_stderr,filter`, after lm-eval's `alias`: avg@n is lm-eval's exact_match (the
    mean share of right samples), GSM8K's two filters keep their names, and majority
    voting is its self-consistency task's `maj@N` filter."""
    n = int(metrics["samples_per_problem"])
    names = {f"avg@{n}": "exact_match,none", f"maj@{n}": f"exact_match,maj@{n}"}
    names |= {"strict-match": "exact_match,strict-match"}
    names |= {"flexible-extract": "exact_match,flexible-extract", f"f1@{n}": "f1,none"}
    names |= {key: f"{key},none" for key in stderrs if key.startswith("pass@")}
    out: dict[str, Any] = {"alias": name}
    for ours, theirs in names.items():
        if ours in stderrs:
            metric, flt = theirs.split(",")
            out[theirs] = metrics[ours]
            out[f"{metric}_stderr,{flt}"] = stderrs[ours]
    return out


def _sha(text: str | None) -> str | None:
    return None if text is None else digest(text)


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
        "git_hash": collabrl_commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# The sections keyed by benchmark, merged by a suite's results.json; a reader requires
# the first four (format 1 has no others).
REQUIRED = ("results", "higher_is_better", "n-samples", "configs")
BY_BENCHMARK = (*REQUIRED, "n-shot", "task_hashes")


def merge_results(config: EvalConfig, folders: dict[str, Path], out: Path) -> dict[str, Any]:
    """A suite's results.json in `out`, from the results.json of each benchmark's folder
    (under `out`): every benchmark's sections under its name, its samples by their path
    from `out`, and the suite's own config (its benchmark list)."""
    merged: dict[str, Any] = {"format": RESULTS_FORMAT, **{key: {} for key in BY_BENCHMARK}}
    merged["samples"] = {}
    seconds: list[float | None] = []
    for name, folder in folders.items():
        doc = read_results(folder / RESULTS)
        for key in BY_BENCHMARK:
            merged[key].update(doc.get(key, {}))
        merged["samples"][name] = str((folder / runs.SAMPLES).relative_to(out))
        merged["chat_template"] = doc.get("chat_template")  # one policy: one template
        seconds.append(doc.get("total_evaluation_time_seconds"))
    merged["model"] = redact_text(config.model)
    merged["model_sha"] = hub_commit(config.model)
    merged["protocol"] = config.protocol.name
    merged["config"] = shareable_config(config)
    merged["chat_template_sha"] = _sha(merged["chat_template"])
    total = None if None in seconds else round(sum(s for s in seconds if s is not None), 2)
    merged["total_evaluation_time_seconds"] = total
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
    for key in (*REQUIRED, "samples", "config"):
        if not isinstance(doc.get(key), dict):
            raise UserError(f"{path} has no {key} mapping", NOT_RESULTS)
    for name, metrics in doc["results"].items():
        if not isinstance(metrics, dict) or not isinstance(doc["samples"].get(name), str):
            raise UserError(f"{path}: benchmark {name!r} has no metrics or samples", NOT_RESULTS)
    return doc
