"""`collab evolve`: K models × R rounds of proposals over a shared state.

Each round:
1. every model proposes `sampling.n` candidates per problem through the protocol
   (with its tools), all models at once on a thread each, one batched `run` each;
   from round 2 on the task's question carries the problem's digest of the state;
2. every candidate's code is re-run in the sandbox and checked against its answer
   (`execute.py`), then the candidate is reviewed by other models (`verify.py`), who
   read that check, and scored;
3. selection (`select.py`) runs over the state: every candidate so far;
4. the round's candidates and summary are saved, and the curve redrawn.

Gold answers only fill `Candidate.correct` for the reported accuracies: no prompt,
review or selection reads them. A folder with finished rounds is continued with
`resume=True` (from the first unfinished round, under the same experiment).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collabrl import runs
from collabrl.data.benchmarks import Benchmark, Fields, Item, load_benchmark
from collabrl.engines import SamplingParams, create_engine
from collabrl.engines.endpoints import check_collaborator
from collabrl.episode import Episode
from collabrl.errors import UserError
from collabrl.eval.runner import policy_template
from collabrl.evolve.config import RESUMABLE_KEYS, EvolveConfig
from collabrl.evolve.execute import execute_checks, execution_tool
from collabrl.evolve.metrics import plot_curve, round_summary
from collabrl.evolve.prompts import digest, evolve_question
from collabrl.evolve.state import (
    Candidate,
    checks_of,
    read_candidates,
    read_state,
    round_path,
    save_round,
)
from collabrl.evolve.verify import Reviewer, in_parallel, review
from collabrl.models import resolve_model
from collabrl.protocols.base import CollabProtocol, Task
from collabrl.protocols.build import build_protocol, check_protocol
from collabrl.protocols.saved import unread_protocol_keys
from collabrl.protocols.seeds import hashed_seed

CURVE = "curve.png"
RoundFn = Callable[[dict[str, Any]], None]


@dataclass
class EvolveResult:
    out_dir: Path
    rounds: list[dict[str, Any]]  # state.json's entry of every finished round
    new_rounds: int


@dataclass
class Proposer:
    name: str
    protocol: CollabProtocol
    reviewer: Reviewer  # the same engine, reviewing the other models' candidates


def run_evolve(
    config: EvolveConfig, resume: bool = False, on_round: RoundFn | None = None
) -> EvolveResult:
    """Run (or, with `resume`, continue) an evolve run and write its folder."""
    config.check()
    _check_references(config)
    bench = load_benchmark(config.benchmark, Fields.of(config), config.limit)
    template = policy_template(config, bench)
    check_protocol(config.protocol, template if config.prompt else None)
    out_dir = runs.out_folder(config.out, "evolve", config.benchmark, config.models[0])
    with _open_folder(config, out_dir, resume) as state:
        done = len(state["rounds"])
        if done < config.rounds:
            _run_rounds(config, bench, template, out_dir, state, on_round)
    return EvolveResult(out_dir, state["rounds"], max(config.rounds - done, 0))


def _check_references(config: EvolveConfig) -> None:
    """A mistyped model, verifier or tokenizer, or a URL that does not answer, is one
    error before the folder is written or any model loads."""
    for ref in [*config.models, *config.verifiers]:
        check_collaborator(ref, config.engine.api_key)
    if config.protocol.tokenizer is not None:
        resolve_model(config.protocol.tokenizer)


@contextmanager
def _open_folder(config: EvolveConfig, out_dir: Path, resume: bool) -> Iterator[dict[str, Any]]:
    """The state of `out_dir` for the block, refusing to restart a run there unless
    resuming it; a folder this run made is removed if the block fails before round 1."""
    finished = round_path(out_dir, 1)
    if runs.read_records(finished) and not resume:
        raise UserError(
            f"{out_dir} already holds an evolve run",
            "pass --resume to continue it, or a new --out folder",
        )
    unread = unread_protocol_keys(config.protocol)
    with runs.run_folder(config, out_dir, RESUMABLE_KEYS, (finished,), omit=unread):
        yield read_state(out_dir)


def _run_rounds(
    config: EvolveConfig,
    bench: Benchmark,
    template: Any,
    out_dir: Path,
    state: dict[str, Any],
    on_round: RoundFn | None,
) -> None:
    """The rounds after the state's last finished one, each saved as it ends."""
    done = len(state["rounds"])
    pool = read_candidates(out_dir, done)
    tool = execution_tool(config.sandbox) if config.execute else None
    proposers = _open_proposers(config, bench, template)
    verifiers: list[Reviewer] = []
    try:
        for ref in config.verifiers:  # one at a time: a failure closes those opened
            verifiers.append(Reviewer(ref, create_engine(ref, config.engine)))
        for round_no in range(done + 1, config.rounds + 1):
            new = _propose(config, proposers, bench.items, pool, round_no)
            reviewers = verifiers or [p.reviewer for p in proposers]
            questions = {item.id: item.problem for item in bench.items}
            params = SamplingParams(config.review_max_tokens, seed=config.sampling.seed)
            if tool:  # first: the reviewers read what the re-run found
                execute_checks(new, tool)
            review(new, questions, reviewers, not verifiers, params, config.trim_chars)
            pool += new
            summary = round_summary(round_no, new, pool, bench.items, len(config.models))
            save_round(out_dir, state, new, summary)
            plot_curve(state["rounds"], out_dir / CURVE, f"evolve · {bench.name}")
            if on_round:
                on_round(summary)
    finally:
        _close(proposers, verifiers)


def _open_proposers(config: EvolveConfig, bench: Benchmark, template: Any) -> list[Proposer]:
    """One engine per model, shared by its protocol (which leaves it open) and its reviews."""
    proposers: list[Proposer] = []
    try:
        for ref in config.models:
            engine = create_engine(ref, config.engine)
            reviewer = Reviewer(ref, engine)
            proposers.append(Proposer(ref, _protocol(config, bench, template, reviewer), reviewer))
    except BaseException:
        _close(proposers, [])
        raise
    return proposers


def _protocol(config: EvolveConfig, bench: Benchmark, template: Any, reviewer: Reviewer):
    try:
        return build_protocol(
            config.protocol,
            reviewer.name,
            config.engine,
            template,
            bench.extract_fallback,
            policy_engine=reviewer.engine,
        )
    except BaseException:
        reviewer.engine.close()
        raise


def _close(proposers: list[Proposer], verifiers: list[Reviewer]) -> None:
    for p in proposers:
        p.protocol.close()
        p.reviewer.engine.close()
    for v in verifiers:
        v.engine.close()


def _propose(
    config: EvolveConfig,
    proposers: list[Proposer],
    items: list[Item],
    pool: list[Candidate],
    round_no: int,
) -> list[Candidate]:
    """Every model's candidates for every problem, the models running concurrently."""
    questions = {i.id: evolve_question(i.problem, _notes(config, pool, i)) for i in items}
    by_id = {item.id: item for item in items}

    def job(k: int) -> list[Candidate]:
        # Every branch of every problem in one batched call: a candidate is an episode
        # (its problem and branch, the task's sample), seeded by the protocol on its own
        # whatever else is in the batch, from this round's and this model's seed.
        tasks = [Task(i.id, questions[i.id], b) for b in range(config.sampling.n) for i in items]
        episodes = proposers[k].protocol.run(tasks, proposal_params(config, round_no, k))
        return [
            _candidate(config, round_no, k, t, e, by_id)
            for t, e in zip(tasks, episodes, strict=True)
        ]

    per_model = in_parallel([lambda k=k: job(k) for k in range(len(proposers))])
    return [c for candidates in per_model for c in candidates]


def proposal_params(config: EvolveConfig, round_no: int, model: int) -> SamplingParams:
    """The sampling params of model `model`'s proposals in round `round_no`: the run's
    seed, drawn apart per round and model (a candidate's record key with its problem
    and branch, which the protocol's per-episode seeds take in)."""
    params = SamplingParams.of(config.sampling)
    if params.seed is None:
        return params
    return dataclasses.replace(params, seed=hashed_seed(params.seed, "evolve", round_no, model))


def _notes(config: EvolveConfig, pool: list[Candidate], item: Item) -> str:
    """The problem's digest of the state; empty in round 1."""
    earlier = [c for c in pool if c.problem_id == item.id]
    return digest(earlier, config.digest_size, config.trim_chars)


def _candidate(
    config: EvolveConfig,
    round_no: int,
    k: int,
    task: Task,
    episode: Episode,
    by_id: dict[str, Item],
) -> Candidate:
    return Candidate(
        round=round_no,
        problem_id=task.problem_id,
        model=k,
        branch=task.sample,
        answer=episode.answer,
        completion=episode.response_text,
        checks=checks_of(episode, config.trim_chars // 2),
        correct=by_id[task.problem_id].is_correct(episode.answer),
        episode=episode.to_dict(),
    )
