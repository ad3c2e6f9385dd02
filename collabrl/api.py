"""The Python API: `collabrl.evaluate` and `collabrl.train`, what `collab eval` and `collab
train` do, called from Python.

Each builds its command's config in the command's layers (defaults < a config file < the
keyword arguments < `overrides`), runs the same checks and the same library call, and
returns what the command writes: an evaluation's results.json document, a training run's
folder and logs. Bad input raises `collabrl.errors.UserError` (its message is the CLI's
one line); the warnings the CLI prints before a run are Python `UserWarning`s here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collabrl.config import build_config, check_sections, read_yaml
from collabrl.errors import UserError

if TYPE_CHECKING:
    from collabrl.train.trainer import TrainResult

Progress = Callable[[int, int], None]
ConfigSource = str | Path | Mapping[str, Any] | None

# The keyword arguments of `evaluate` and `train`: name -> the config key it sets (the key
# its CLI option sets). Anything else goes in `overrides`, by its dotted key.
EVAL_KEYWORDS = {
    "model": "model",
    "protocol": "protocol.name",
    "n": "sampling.n",
    "max_tokens": "sampling.max_tokens",
    "temperature": "sampling.temperature",
    "seed": "sampling.seed",
    "limit": "limit",
    "out": "out",
    "device": "engine.device",
    "batch_size": "engine.batch_size",
}
TRAIN_KEYWORDS = {
    "model": "model",
    "data": "data",
    "protocol": "protocol.name",
    "steps": "steps",
    "prompts_per_step": "prompts_per_step",
    "num_generations": "sampling.n",
    "max_tokens": "sampling.max_tokens",
    "learning_rate": "learning_rate",
    "beta": "beta",
    "seed": "seed",
    "limit": "limit",
    "eval_data": "eval_data",
    "eval_limit": "eval_limit",
    "out": "out",
    "device": "engine.device",
}


def evaluate(
    benchmark: str,
    model: str | None = None,
    *,
    protocol: str | None = None,
    n: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    limit: int | None = None,
    out: str | Path | None = None,
    device: str | None = None,
    batch_size: int | None = None,
    revision: str | None = None,
    config: ConfigSource = None,
    overrides: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Evaluate `model` on `benchmark` (a registered name, a data file, or several names
    joined by commas) as `collab eval` does, and return the run's results.json document.

    `config` is a YAML file or a mapping shaped like one (`collab config show eval`);
    `overrides` maps dotted keys to values (`{"protocol.teacher": "reference"}`), last of
    all, as `--set` does. A keyword left None leaves the config's value. A run folder
    that exists is resumed. Several benchmarks need `out`: their merged results.json is
    written there."""
    from collabrl.eval.config import EvalConfig
    from collabrl.eval.results import RESULTS, read_results
    from collabrl.eval.runner import run_eval
    from collabrl.eval.suite import benchmark_names, run_suite

    given = dict(
        model=model,
        protocol=protocol,
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        limit=limit,
        out=out,
        device=device,
        batch_size=batch_size,
    )
    layer = {"benchmark": benchmark, **_layer(EVAL_KEYWORDS, given)}
    cfg = _config(EvalConfig, _file_layer(EvalConfig, config), layer, overrides)
    _pin(cfg, revision)
    cfg.check()
    _warn(cfg.warnings())
    names = benchmark_names(cfg.benchmark)
    if len(names) == 1:
        return read_results(run_eval(cfg, progress=progress).out_dir / RESULTS)
    if cfg.out is None:
        raise UserError(
            f"{len(names)} benchmarks and no out folder",
            "pass out=DIR: each benchmark runs in DIR/<name>, their results.json in DIR",
        )
    run_suite(cfg, names, lambda _: nullcontext(progress))
    return read_results(Path(cfg.out) / RESULTS)


def train(
    method: str = "grpo",
    model: str | None = None,
    data: str | None = None,
    *,
    protocol: str | None = None,
    steps: int | None = None,
    prompts_per_step: int | None = None,
    num_generations: int | None = None,
    max_tokens: int | None = None,
    learning_rate: float | None = None,
    beta: float | None = None,
    seed: int | None = None,
    limit: int | None = None,
    eval_data: str | None = None,
    eval_limit: int | None = None,
    out: str | Path | None = None,
    device: str | None = None,
    revision: str | None = None,
    config: ConfigSource = None,
    overrides: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    report: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train a policy with `method` (grpo, relay, eapo, rsim or a registered method trained
    by GRPO) as `collab train METHOD`
    does, and return the finished run: `out_dir` (config.yaml, metrics.jsonl, final/, the
    curves), `steps`, `history` (every line of metrics.jsonl) and, with `eval_data`,
    `evaluation` (eval.json: the starting and the trained policy's held-out metrics and
    their paired change).

    `config`, `overrides` and a keyword left None work as in `evaluate`; `progress(done,
    total)` moves with the optimizer steps, `report` gets the CLI's line per step."""
    from collabrl.train.grpo import train_grpo
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.methods import registry as methods
    from collabrl.train.plan import run_warnings
    from collabrl.train.resolve import resolve_run

    if method not in methods.grpo_names():
        raise UserError(
            f"unknown method {method!r}", f"use one of {', '.join(methods.grpo_names())}"
        )
    given = dict(
        model=model,
        data=data,
        protocol=protocol,
        steps=steps,
        prompts_per_step=prompts_per_step,
        num_generations=num_generations,
        max_tokens=max_tokens,
        learning_rate=learning_rate,
        beta=beta,
        seed=seed,
        limit=limit,
        eval_data=eval_data,
        eval_limit=eval_limit,
        out=out,
        device=device,
    )
    file = _file_layer(GRPOTrainConfig, config)
    if str(file.get("method", method)) != method:  # as `collab train METHOD -c FILE` refuses
        raise UserError(
            f"the config sets method {file['method']}, but this is train({method!r})",
            "drop method from the config, or pass its method",
        )
    layer = {**_layer(TRAIN_KEYWORDS, given), "method": method}
    cfg = _config(GRPOTrainConfig, file, layer, overrides)
    _pin(cfg, revision)
    run = resolve_run(cfg)
    _warn(run_warnings(run))
    return train_grpo(run, progress, report)


def _pin(cfg: Any, revision: str | None) -> None:
    """`cfg.model` at `revision`, a hub name pinned to the commit it loads, and each hub
    name among its collaborators likewise: as `--revision` and the CLI's pinning
    (`cli.options.resolve`), so a run's saved config and results.json name the same
    weights whichever way it was started."""
    from collabrl.models import at_revision, pin_loaded
    from collabrl.protocols.registry import pin_collaborators

    cfg.model = pin_loaded(at_revision(cfg.model, revision, "model"))
    pin_collaborators(cfg.protocol)


def _layer(keys: Mapping[str, str], given: Mapping[str, Any]) -> dict[str, Any]:
    """The config layer of the keyword arguments given (not None), nested by their keys."""
    layer: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            continue
        *sections, leaf = keys[name].split(".")
        node = layer
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = str(value) if isinstance(value, Path) else value
    return layer


def _file_layer(cls: type, config: ConfigSource) -> dict[str, Any]:
    """The layer of `config` for a `cls`: a YAML file, read and checked as `--config` is,
    or a mapping."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    layer = read_yaml(Path(config))
    check_sections(cls, Path(config))
    return layer


def _config(
    cls: type,
    file: dict[str, Any],
    layer: dict[str, Any],
    overrides: Mapping[str, Any] | None,
) -> Any:
    """`cls` from its layers: defaults < `file` < `layer` < `overrides` (dotted keys)."""
    dotted = _layer({key: key for key in overrides or {}}, overrides or {})
    return build_config(cls, [file, layer, dotted])


def _warn(lines: list[str]) -> None:
    for line in lines:
        warnings.warn(line, UserWarning, stacklevel=3)
