"""Warnings where a user is about to fool themselves (issue 35), as pure checks.

Each check returns one line, or None when there is nothing to say. The training dry run
lists them with its other warnings (`train/plan.py`), and the real commands print them
before they start: `collab train`, `collab build-warmup` and `collab filter`. They live
here, at the evaluation layer, because what they guard is an evaluation's meaning (a
held-out score, a stand-in's numbers), and because both the builders and the trainers,
one layer up and not allowed to import each other, need them.

- `split_warning`: the problems are a benchmark's test split (the registry's
  `split`), by name, as the shipped file, or as a run folder made from one (a `collab
  filter` or `build-warmup` output records its `data` in its config.yaml);
- `stand_in_warning`: a collaborator is the `reference` stand-in, which reads the gold
  answer (eval and filter say so under their numbers; a training run says so up front);
- `unwarmed_call_warning`: a policy never trained on a call protocol's syntax almost
  never writes a call, so RL on relay or consult has nothing to reinforce.

"Warmed" is read from the policy's folder, as collabrl writes it: a run's `final/` or
`checkpoints/checkpoint-N/` beside the run's config.yaml, where that run was a
supervised warm-up (`collab train sft`: its config has `epochs`) or RL on the same
protocol. Anything else (an embedded name, a GGUF file, a Hugging Face folder, a `train
grpo` output) counts as not warmed; a policy warmed up outside collabrl gets the
warning too, which says so. A policy that is not on this machine (a dry run for a
cluster) is not judged.

RelayLLM (§3.1) warms the policy up before RL because a base model never calls; EAPO
trains from a prompted instruct model, and `collab build-warmup consult` is this
project's addition for the small models it trains here. AlphaApollo's `<tool_call>` is
left out: instruct models call tools from the prompt, as the paper trains them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from collabrl import runs
from collabrl.config import read_yaml
from collabrl.data.benchmarks import BenchmarkSpec, data_dir, registry
from collabrl.engines.reference import STAND_IN_NOTE
from collabrl.errors import UserError
from collabrl.models import resolve_model
from collabrl.protocols import registry as protocols

if TYPE_CHECKING:
    from collabrl.protocols.config import ProtocolConfig

# How many run folders a data path is followed back through (a filter's output built
# from another's): the chain is short, and a loop of configs must end.
MAX_PROVENANCE = 4


def split_warning(data: str, job: str = "training on") -> str | None:
    """A warning when `data` (a registered name or a path) holds a benchmark's test split:
    a score on that benchmark after `job` on it measures memory, not skill."""
    spec, via = _test_split(data, MAX_PROVENANCE)
    if spec is None:
        return None
    trains = [s.name for s in registry().values() if s.split == "train"]
    own = f"{spec.name}_train"
    fix = f"use {own}" if own in trains else f"use a training set ({', '.join(trains)})"
    return (
        f"{job} '{data}'{via}: the test split of the benchmark '{spec.name}', so its "
        f"held-out scores are no longer held out; {fix}"
    )


def _test_split(data: str, depth: int) -> tuple[BenchmarkSpec | None, str]:
    """The test-split benchmark `data` holds and how it was found; (None, "") if none."""
    specs = registry()
    if data in specs:
        return (specs[data], "") if specs[data].split != "train" else (None, "")
    path = Path(data).expanduser()
    for spec in specs.values():
        if spec.split != "train" and _same_file(path, data_dir() / spec.file):
            return spec, ""
    folders = (path, path.parent) if path.exists() else ()  # a run folder, or a file in one
    for folder in folders:
        source = _recorded_data(folder)
        if source is not None and depth > 0 and source != data:
            spec, via = _test_split(source, depth - 1)
            if spec is not None:
                return spec, via or f" (made from '{source}', {folder / runs.CONFIG})"
    return None, ""


def _same_file(path: Path, shipped: Path) -> bool:
    try:
        return path.is_file() and path.samefile(shipped)
    except OSError:
        return False


def _recorded_data(folder: Path) -> str | None:
    """The `data` a collabrl run folder's config.yaml records, if it has one."""
    recorded = _run_config(folder).get("data")
    return recorded if isinstance(recorded, str) else None


def _run_config(folder: Path) -> dict:
    """The config.yaml of a folder collabrl wrote (its provenance header says so: a
    user's own config.yaml in the working directory is not a record), or {} where there
    is none or it cannot be read: a warning never stops a run."""
    path = folder / runs.CONFIG
    try:
        if not path.is_file():
            return {}
        with path.open(encoding="utf-8", errors="replace") as file:
            if not file.readline().startswith(f"# {runs.WRITTEN_BY}"):
                return {}
        return read_yaml(path)
    except (OSError, UserError):
        return {}


def stand_in_warning(protocol: ProtocolConfig) -> str | None:
    """The stand-in note (the one eval and filter print) when a collaborator of
    `protocol` is the `reference` stand-in."""
    return STAND_IN_NOTE if protocols.uses_reference(protocol) else None


def unwarmed_call_warning(policy: str, protocol: ProtocolConfig) -> str | None:
    """A warning when `protocol` needs the policy to call and `policy` was not warmed up
    on it (see the module's note for how that is read)."""
    spec = protocols.get(protocol.name)
    call = spec.call_syntax
    if call is None or not spec.calls(protocol):
        return None
    try:
        ref = resolve_model(policy)
    except UserError:
        return None  # not on this machine: nothing to read
    if ref.kind in ("hf", "lora") and _warmed(ref.source, protocol.name):
        return None
    return (
        f"the policy '{policy}' was not warmed up on {protocol.name}'s {call}: an un-warmed "
        f"model almost never calls, so RL has no call to reinforce; build a warm-up set "
        f"with `collab build-warmup {protocol.name}` and train on it with `collab train "
        "sft` first (ignore this for a model warmed up outside collabrl)"
    )


def _warmed(folder: Path, protocol: str) -> bool:
    """Whether `folder` is a model a collabrl run trained on calls: the output of a
    supervised warm-up, or of RL on `protocol`."""
    for run in (folder.parent, folder.parent.parent):  # final/, checkpoints/checkpoint-N/
        config = _run_config(run)
        if "epochs" in config:  # `collab train sft`
            return True
        trained_on = config.get("protocol")
        if isinstance(trained_on, dict) and trained_on.get("name") == protocol:
            return True
    return False
