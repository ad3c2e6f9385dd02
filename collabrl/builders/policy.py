"""What the warm-up builders share: their folder opened on their data, and the policy
(a model reference or URL) sampled into it, answering alone or under a protocol."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from collabrl import runs
from collabrl.builders.folder import BuildFolder
from collabrl.builders.sampling import MakeRow, write_rows
from collabrl.config import EngineConfig, SamplingConfig
from collabrl.data.benchmarks import MAX_PROBLEM_CHARS, Benchmark, Fields, load_benchmark
from collabrl.data.prompts import PromptTemplate
from collabrl.engines.base import Engine, SamplingParams
from collabrl.engines.endpoints import check_collaborator
from collabrl.eval.runner import chunk_size
from collabrl.models import resolve_model
from collabrl.protocols.build import build_protocol
from collabrl.protocols.config import ProtocolConfig
from collabrl.protocols.sampling import Unit, sample_chunks

# A problem row over MAX_PROBLEM_CHARS is skipped, not sampled, and recorded as this
# rejection: one such row must not end a build over a large data set.
OVERSIZED = f"problem over {MAX_PROBLEM_CHARS} characters"


class PolicyConfig(Protocol):
    """What a warm-up builder's config says about its data and its policy (its data's
    columns too: a `DataColumns`)."""

    problem_field: str
    answer_field: str
    id_field: str
    split: str | None
    model: str
    data: str
    limit: int | None
    out: str | None
    tokenizer: str | None
    sampling: SamplingConfig
    engine: EngineConfig

    def check(self) -> None: ...


@contextmanager
def open_build(
    config: PolicyConfig, kind: str, resumable: frozenset[str], engine: Engine | None
) -> Iterator[tuple[Benchmark, BuildFolder]]:
    """Check the config, the policy (a model that resolves, a URL that answers) and its
    tokenizer, load the data, then open the folder for the block, before any model
    loads; a build that fails before its first row or rejection leaves no folder."""
    config.check()
    if engine is None:
        check_collaborator(config.model, config.engine.api_key)
    if config.tokenizer is not None:
        resolve_model(config.tokenizer)
    bench = load_benchmark(config.data, Fields.of(config), config.limit, keep_oversized=True)
    out = runs.out_folder(config.out, kind, config.data, config.model)
    with BuildFolder.open(config, out, resumable) as folder:
        yield bench, folder


def sample_into(
    folder: BuildFolder,
    config: PolicyConfig,
    template: PromptTemplate | None,
    units: list[Unit],
    row_maker: Callable[[Any], MakeRow],
    progress: Callable[[int, int], None] | None,
    engine: Engine | None = None,
    rows_wanted: int | None = None,
    protocol: ProtocolConfig | None = None,
) -> int:
    """Sample the units not done yet into the folder; how many were sampled now.

    `row_maker` gets the opened protocol (its policy's tokenizer, say) and returns what
    turns a sampled unit into a row or a rejection. `protocol` is the one the units are
    sampled under (default solo).
    """
    done = folder.done()
    # Never sampled, not even with its chunk (a partly done chunk is sampled again whole).
    done |= folder.reject(
        [u.key for u in units if u.key not in done and u.item.oversized], OVERSIZED
    )
    units = [u for u in units if not u.item.oversized]
    todo = sum(u.key not in done for u in units)
    if not todo or (rows_wanted is not None and len(folder.rows()) >= rows_wanted):
        return 0
    with open_policy(config, template, engine, protocol) as policy:
        chunk = chunk_size(config.engine, config.model)
        params = SamplingParams.of(config.sampling)
        batches = sample_chunks(policy, units, chunk, params, done)
        write_rows(folder, batches, row_maker(policy), progress, todo, rows_wanted)
    return len(folder.done()) - len(done)


@contextmanager
def open_policy(
    config: PolicyConfig,
    template: PromptTemplate | None,
    engine: Engine | None = None,
    protocol: ProtocolConfig | None = None,
) -> Iterator[Any]:
    """The policy under `protocol` (default: answering alone) with `template` (None for
    a protocol with its paper's own prompt), closed when the block ends.

    An `engine` built by the caller is used instead of loading the model, and left open.
    """
    spec = dataclasses.replace(protocol or ProtocolConfig(), tokenizer=config.tokenizer)
    built = build_protocol(spec, config.model, config.engine, template, policy_engine=engine)
    try:
        yield built
    finally:
        built.close()
