"""One problem through one protocol: what `collab infer` runs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from collabrl.config import DataColumns, EngineConfig, SamplingConfig, option
from collabrl.data.benchmarks import Fields, Item, load_benchmark
from collabrl.data.prompts import get_prompt
from collabrl.engines.base import SamplingParams
from collabrl.episode import Episode
from collabrl.errors import UserError
from collabrl.protocols import registry
from collabrl.protocols.base import Task
from collabrl.protocols.build import build_protocol
from collabrl.protocols.config import ProtocolConfig


@dataclass
class InferConfig(DataColumns):
    """One problem, from the command line or a benchmark item, through one protocol (the
    item's columns named as in `collab eval`)."""

    model: str = option("smollm2-135m", "The policy (reasoner): model reference or base URL.")
    question: str | None = option(None, "The problem text (or use benchmark and item).")
    benchmark: str | None = option(None, "Take the problem from this benchmark.")
    item: str | None = option(None, "Benchmark item id, or its 0-based position (default 0).")
    prompt: str | None = option(None, "Policy prompt template for solo and relay.")
    protocol: ProtocolConfig = option(ProtocolConfig(), "The protocol and its collaborators.")
    sampling: SamplingConfig = option(
        SamplingConfig(max_tokens=256), "Sampling; max_tokens bounds the whole episode."
    )
    engine: EngineConfig = option(EngineConfig(), "The policy's engine.")

    def check(self) -> None:
        """Refuse values no run can use, before any model is loaded."""
        self.sampling.check()
        self.engine.check()
        registry.check_protocol_config(self.protocol)


def infer_one(config: InferConfig) -> tuple[Episode, float]:
    """Run the problem once; return the episode and the seconds it took."""
    task, fallback, bench_prompt = _task(config)
    in_bench_prompt = registry.get(config.protocol.name).bench_prompt
    name = config.prompt or (bench_prompt if in_bench_prompt else None)
    protocol = build_protocol(
        config.protocol,
        config.model,
        config.engine,
        get_prompt(name) if name else None,
        fallback,
    )
    params = SamplingParams.of(config.sampling)
    try:
        began = time.perf_counter()
        [episode] = protocol.run([task], params)
        return episode, time.perf_counter() - began
    finally:
        protocol.close()


def _task(config: InferConfig) -> tuple[Task, tuple[str, ...], str | None]:
    """The task, the benchmark's answer fallbacks and its prompt name."""
    if config.question is not None and config.benchmark is not None:
        raise UserError("give a question or a benchmark item, not both")
    if config.benchmark is None:
        if not (config.question or "").strip():
            raise UserError("no problem given", "pass a QUESTION, or --bench NAME [--item ID]")
        if registry.uses_reference(config.protocol):
            raise UserError(
                "the reference stand-in needs a benchmark item (it answers from the gold answer)",
                "pass --bench NAME [--item ID] instead of a QUESTION",
            )
        return Task("cli", config.question), (), None
    bench = load_benchmark(config.benchmark, Fields.of(config))
    item = _pick(bench.items, config.item or "0")
    task = Task(item.id, item.problem, reference=item.reference)
    return task, bench.extract_fallback, bench.prompt


def _pick(items: list[Item], key: str) -> Item:
    for item in items:
        if item.id == key:
            return item
    if key.isdigit() and int(key) < len(items):
        return items[int(key)]
    raise UserError(f"no item '{key}' in the benchmark ({len(items)} items)", "pass an id or 0..")
