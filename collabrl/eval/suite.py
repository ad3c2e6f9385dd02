"""`collab eval aime24,math500 …`: several benchmarks in one command, with one set of options.

Every benchmark is checked (name, rows, prompt) before any folder is written, and every
run folder before a model loads; then the benchmarks run in turn, each into its own
folder (`--out DIR` gives `DIR/<benchmark>`), on one policy engine loaded once;
`DIR/results.json` then holds every benchmark's results.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, closing, nullcontext
from dataclasses import replace
from pathlib import Path

from collabrl import runs
from collabrl.engines import Engine, create_engine
from collabrl.errors import UserError
from collabrl.eval.config import EvalConfig
from collabrl.eval.results import RESULTS, merge_results
from collabrl.eval.runner import (
    EvalPlan,
    EvalResult,
    ProgressFn,
    plan_eval,
    prepare_run_folder,
    run_plan,
)

# A progress callback for one benchmark's run, open while that benchmark samples.
ProgressFor = Callable[[EvalConfig], AbstractContextManager[ProgressFn | None]]


def benchmark_names(text: str) -> list[str]:
    """The benchmarks of `text`: one name or path, or several separated by commas.

    A path that exists is one benchmark even with a comma in its name.
    """
    if not text.strip(" ,"):
        raise UserError("no benchmark given", "name one (see `collab benchmarks`): aime24,math500")
    if "," not in text or Path(text).expanduser().exists():
        return [text]
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise UserError(
            f"an empty benchmark name in '{text}'", "separate the names by single commas"
        )
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UserError(f"benchmark '{twice[0]}' is named twice", "name each benchmark once")
    return names


def plan_suite(config: EvalConfig, names: list[str]) -> list[EvalPlan]:
    """One checked plan per benchmark, each with its own run folder."""
    plans = [plan_eval(replace(config, benchmark=name)) for name in names]
    folders = [plan.bench.name for plan in plans]
    shared = sorted({name for name in folders if folders.count(name) > 1})
    if shared:
        raise UserError(
            f"two benchmarks would share the run folder name '{shared[0]}'",
            "run them in separate commands",
        )
    return [_in_own_folder(plan, config.out) for plan in plans]


def _in_own_folder(plan: EvalPlan, out: str | None) -> EvalPlan:
    """`plan` writing into `out/<benchmark>`; without --out each run gets its default folder."""
    if out is None:
        return plan
    return replace(plan, config=replace(plan.config, out=str(Path(out) / plan.bench.name)))


def run_suite(
    config: EvalConfig, names: list[str], progress_for: ProgressFor | None = None
) -> dict[str, EvalResult]:
    """Run (or resume) every benchmark of `names` with `config`'s options, in turn.

    Returns each benchmark's result under its folder name, in order.
    """
    plans = plan_suite(config, names)
    # Every folder before any model: a folder holding another experiment is refused
    # before the first benchmark spends any time.
    folders = [prepare_run_folder(plan.config) for plan in plans]
    results: dict[str, EvalResult] = {}
    with closing(_SharedPolicy(config)) as policy:
        for plan, folder in zip(plans, folders, strict=True):
            bar = progress_for(plan.config) if progress_for else nullcontext(None)
            with bar as progress:
                results[plan.bench.name] = run_plan(plan, folder, policy.engine, progress)
    if config.out is not None:  # one results.json over the suite's folders, beside them
        out = Path(config.out)
        folders = {name: result.out_dir for name, result in results.items()}
        runs.write_json(out / RESULTS, merge_results(config, folders, out))
    return results


class _SharedPolicy:
    """The policy's engine, loaded when a benchmark first has samples to draw and kept
    for the next: one model load per command, and never two vLLM engines in a process."""

    def __init__(self, config: EvalConfig) -> None:
        self._config = config
        self._engine: Engine | None = None

    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = create_engine(self._config.model, self._config.engine)
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
