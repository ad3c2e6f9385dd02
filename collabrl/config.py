"""Typed configs: dataclasses whose every field carries a help string.

A run's config is built in layers — dataclass defaults, then a YAML file, then
CLI options, then `--set key.sub=value` — and validated strictly: an unknown
key or a value of the wrong type is a `UserError`, never silently dropped.
The resolved config is saved in every run folder (`save_config`).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from collabrl.devices import check_device, check_dtype
from collabrl.errors import UserError, require
from collabrl.userfiles import (
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    BoundedLoader,
    load_yaml,
    parse_yaml,
    read_user_text,
)

T = TypeVar("T")


def option(default: Any, help: str) -> Any:
    """A dataclass field with a default and the help text shown in docs and `--help`."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    if is_dataclass(default):
        return field(default_factory=lambda: dataclasses.replace(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


# pass@k papers report k up to 1024; far beyond that a run only fills memory with work units.
MAX_SAMPLES = 1024
# Token counts and seeds travel through 32-bit integers in vLLM and the HTTP servers.
_INT32_MAX = 2**31 - 1


@dataclass
class DecodingConfig:
    """How completions are sampled, the seed aside: a training run's `sampling` section,
    whose seed is the run's own (`seed`, as in TRL)."""

    n: int = option(1, "Samples per problem (the n of pass@k, avg@n, maj@n).")
    max_tokens: int = option(
        1024, "Maximum new tokens per completion (in training, per episode, every author's)."
    )
    temperature: float = option(0.0, "Sampling temperature; 0 means greedy decoding.")
    top_p: float = option(1.0, "Nucleus sampling cut-off.")
    top_k: int = option(-1, "Top-k cut-off; -1 disables it.")

    def check(self) -> None:
        """Refuse sampling values no engine can honour, before any model is loaded."""
        s = self
        require("sampling.n", s.n, 1 <= s.n <= MAX_SAMPLES, f"between 1 and {MAX_SAMPLES}")
        require(
            "sampling.max_tokens",
            s.max_tokens,
            1 <= s.max_tokens <= _INT32_MAX,
            f"between 1 and {_INT32_MAX}",
        )
        # NaN fails every comparison, so these also refuse `nan`.
        require(
            "sampling.temperature",
            s.temperature,
            0 <= s.temperature < float("inf"),
            "a finite number >= 0",
        )
        require("sampling.top_p", s.top_p, 0 < s.top_p <= 1, "in (0, 1]")
        require(
            "sampling.top_k", s.top_k, s.top_k == -1 or 1 <= s.top_k <= _INT32_MAX, "-1 or >= 1"
        )


@dataclass
class SamplingConfig(DecodingConfig):
    """How completions are sampled, with the seed that makes a run repeat."""

    seed: int = option(0, "Random seed; runs with the same seed and engine repeat exactly.")

    def check(self) -> None:
        super().check()
        s = self
        require("sampling.seed", s.seed, 0 <= s.seed <= _INT32_MAX, f"between 0 and {_INT32_MAX}")


@dataclass
class DataColumns:
    """Where a user's data file keeps each part of a problem: the fields every command
    that reads problems has (a config inherits them)."""

    problem_field: str = option("problem", "Problem column in user-supplied data.")
    answer_field: str = option("answer", "Answer column in user-supplied data.")
    id_field: str = option("id", "Id column in user-supplied data (default: row number).")
    split: str | None = option(
        None,
        "The split of a saved DatasetDict folder; required when it holds several (a "
        "training run must not pick the test split by itself).",
    )


# What `engine.kind` may say (`engines.resolve_kind` reads it).
ENGINE_KINDS = ("auto", "transformers", "vllm", "openai")


@dataclass
class EngineConfig:
    """Which engine generates text, and its resources."""

    kind: str = option(
        "auto",
        "transformers | vllm | openai | auto (openai for http(s) URLs; for a local model "
        "vllm where it is installed and has a device (a GPU, or vLLM's CPU build), "
        "otherwise transformers; $COLLABRL_AUTO_ENGINE=transformers keeps transformers).",
    )
    batch_size: int = option(16, "Sequences generated together (transformers engine).")
    continuous_batching: bool = option(
        True,
        "transformers engine: a finished sequence's place in the batch goes to the next "
        "waiting one at once (false: static batches, each run until its longest row ends).",
    )
    prefix_cache: bool = option(
        True,
        "transformers engine: a prompt that extends an earlier sequence (the next round of a "
        "multi-turn protocol, another sample of the same prompt) reuses its KV cache "
        "instead of re-reading the prefix.",
    )
    prefix_cache_mb: int = option(
        2048, "Memory the transformers engine keeps for earlier sequences' KV caches (MiB)."
    )
    dtype: str = option(
        "auto",
        "Weights dtype of the transformers engine and of in-process collaborators: auto "
        "(bfloat16 on a GPU that has it, else float16; float32, the fastest, on a CPU), "
        "float32, bfloat16, float16. vLLM: auto is vLLM's own on a GPU, float32 on its CPU build.",
    )
    device: str = option(
        "auto",
        "Torch device of the transformers engine and of in-process collaborators (teacher, "
        "experts, planner): auto (cuda when torch sees a GPU, else cpu), cpu, cuda, cuda:1, mps.",
    )
    api_key: str | None = option(
        None, "API key of an OpenAI-compatible endpoint (default: $COLLABRL_API_KEY)."
    )
    served_model: str | None = option(
        None, "Model name at an OpenAI-compatible endpoint (default: the first it serves)."
    )
    max_concurrency: int = option(16, "Requests in flight at once (openai engine).")
    timeout: float = option(600.0, "Seconds before an HTTP request is abandoned (openai engine).")
    max_retries: int = option(3, "Retries with backoff for failed HTTP requests (openai engine).")
    tensor_parallel_size: int = option(1, "GPUs one model is split across (vllm engine).")
    gpu_memory_utilization: float = option(0.8, "Fraction of GPU memory vLLM may take.")
    max_model_len: int | None = option(None, "Context length cap for vLLM (default: model's).")
    kv_cache_mb: int = option(
        4096,
        "vLLM's CPU build: memory for its KV cache (MiB); on a GPU, gpu_memory_utilization "
        "decides (on a CPU it would be a share of the machine's RAM).",
    )
    enforce_eager: bool = option(
        False,
        "vLLM: run the model eagerly, without torch.compile or CUDA graphs (starts in "
        "seconds instead of minutes, decodes slower).",
    )
    chat_template_kwargs: dict[str, Any] = option(
        {},
        "Options for the model's chat template, e.g. {enable_thinking: false} (Qwen3's "
        "non-thinking mode); sent in the request body to OpenAI-compatible servers.",
    )

    def check(self, key: str = "engine") -> None:
        """Refuse a batch size, device or dtype no engine runs, before any model is loaded
        (`key`: where this config sits, named in the error)."""
        # Here, not only where the engine starts: a run refused then has written its folder.
        kinds = ", ".join(ENGINE_KINDS)
        require(f"{key}.kind", self.kind, self.kind in ENGINE_KINDS, f"one of {kinds}")
        # Runners hand work to an engine in chunks of these sizes.
        require(f"{key}.batch_size", self.batch_size, self.batch_size >= 1, "at least 1")
        timeout = self.timeout
        require(f"{key}.timeout", timeout, 0 < timeout < float("inf"), "a finite number > 0")
        require(f"{key}.max_retries", self.max_retries, self.max_retries >= 0, "at least 0")
        concurrency = self.max_concurrency
        require(f"{key}.max_concurrency", concurrency, concurrency >= 1, "at least 1")
        check_device(self.device, f"{key}.device")
        check_dtype(self.dtype, f"{key}.dtype")


@dataclass
class EndpointConfig:
    """One place the expert pool can send calls to."""

    # No default: an endpoint without a reference means nothing, so building one fails loudly.
    ref: str = field(
        metadata={
            "help": "Base URL of an OpenAI-compatible server (http(s)://…/v1) or a "
            "local model reference, loaded in-process."
        }
    )
    served_model: str | None = option(
        None, "Model name at the endpoint (default: the first it serves); ignored for local refs."
    )
    api_key: str | None = option(None, "API key of the endpoint (default: $COLLABRL_API_KEY).")


@dataclass
class PoolConfig:
    """The pool of expert models a policy consults (EAPO: up to K experts in parallel)."""

    endpoints: list[str] = option(
        [], "Endpoint refs (URL or local model), one per endpoint; repeat --expert to add more."
    )
    num_experts: int = option(3, "K: the number of experts; expert ids are 1..K as in EAPO.")
    assignment: str = option(
        "round_robin",
        "round_robin: expert i uses endpoints[(i-1) % len]; per_expert: one endpoint per expert.",
    )
    timeout: float = option(60.0, "Seconds one call attempt may take before it is abandoned.")
    retries: int = option(2, "Extra attempts after a failed call (connection errors, timeouts).")
    backoff: float = option(0.5, "Seconds before the first retry; doubled for every further one.")
    api_key: str | None = option(None, "API key sent to every URL endpoint.")
    served_model: str | None = option(None, "Model name requested at every URL endpoint.")
    cache_dir: str | None = option(
        None, "Folder of the on-disk response cache (deterministic calls only); unset: no cache."
    )


# -- building configs from layers --------------------------------------------------


def build_config(
    cls: type[T], layers: list[dict[str, Any]], sets: list[str] = (), prefix: str = ""
) -> T:
    """Merge dict layers (later wins) plus `key.sub=value` strings into a `cls`; errors
    name keys after `prefix` (where the section sits in a larger config)."""
    merged: dict[str, Any] = {}
    for layer in [*layers, *(_parse_set(assignment) for assignment in sets)]:
        _deep_merge(merged, _renamed(cls, layer))
    return _from_dict(cls, merged, prefix=prefix)


# A config class may list keys it renamed, `RENAMED = {"old": "new.dotted"}`: the old
# names are read, with a note, for one release after the rename.
RENAMED_UNTIL = "0.3"


def _renamed(cls: type, layer: dict[str, Any]) -> dict[str, Any]:
    """A copy of `layer` with `cls`'s old key names moved to their new places."""
    layer = copy.deepcopy(layer)
    for old, new in getattr(cls, "RENAMED", {}).items():
        if old not in layer:
            continue
        if new.startswith(f"{old}.") and isinstance(layer[old], dict):
            continue  # the section the old scalar became, already in its new shape
        value = layer.pop(old)
        *sections, leaf = new.split(".")
        node = layer
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise UserError(f"config key '{section}' must be a mapping", "see `collab --help`")
        if leaf in node:
            raise UserError(f"config sets both '{old}' and '{new}'", f"keep only '{new}'")
        node[leaf] = value
        print(
            f"note: config key '{old}' is now '{new}'; the old name is read until "
            f"collabrl {RENAMED_UNTIL}",
            file=sys.stderr,
        )
    return layer


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, turning every way it can fail into a one-line `UserError`."""
    data = parse_yaml(read_user_text(path, "config", MAX_CONFIG_BYTES), f"config {path}") or {}
    if not isinstance(data, dict):
        raise UserError(f"config {path} must be a mapping of keys to values", "fix the file")
    return data


# -- the shipped configs, by name -------------------------------------------------------


def configs_dir() -> Path:
    """The folder of the shipped configs: `collabrl/_configs` in a wheel (pyproject.toml
    ships the repository's configs/ there, as it ships data/), configs/ in a checkout."""
    packaged = Path(__file__).resolve().parent / "_configs"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[1] / "configs"


@dataclass(frozen=True)
class ShippedConfig:
    """A config file that ships with collabrl."""

    name: str  # what `--config` takes from any folder: `eval/greedy-pass1`
    path: Path
    command: str  # what reads it: `eval`, `train relay`, `accelerate launch`
    about: str  # what its first comment line says before a colon: its headline


def shipped_configs() -> list[ShippedConfig]:
    """The shipped configs, by name."""
    root = configs_dir()
    found = []
    for path in sorted(root.glob("*/*.yaml")):
        kind = path.parent.name
        if kind == "train":  # an SFT config has no method: `collab train sft` takes no other
            command = f"train {read_yaml(path).get('method', 'sft')}"
        else:
            command = "accelerate launch" if kind == "accelerate" else kind
        first = next(iter(path.read_text(encoding="utf-8").splitlines()), "")
        headline = first.removeprefix("#").strip().split(": ")[0].removesuffix(":")
        about = headline if first.startswith("#") else ""
        name = path.relative_to(root).with_suffix("").as_posix()
        found.append(ShippedConfig(name, path, command, about))
    return found


def config_file(given: Path) -> Path:
    """The file `--config` names: `given` where a file or folder of that path exists (a
    path wins over a name), else the shipped config of that name (`eval/greedy-pass1`,
    `.yaml` optional), else `given`, which its read reports missing."""
    if given.exists() or given.is_symlink():
        return given
    name = given.as_posix().removesuffix(".yaml")
    return next((c.path for c in shipped_configs() if c.name == name), given)


def to_dict(config: Any, omit: Collection[str] = ()) -> dict[str, Any]:
    """`config` as nested dicts, less the dotted keys in `omit` (a run folder leaves out
    the sections its run never reads; a key that is not there is skipped)."""
    data = dataclasses.asdict(config)
    for key in omit:
        *sections, leaf = key.split(".")
        node = data
        for section in sections:
            node = node.get(section, {})
        node.pop(leaf, None)
    return data


def save_config(config: Any, path: Path, omit: Collection[str] = (), header: str = "") -> None:
    """Write `config` as YAML, less the keys in `omit`, after `header` (YAML comments)."""
    text = header + yaml.safe_dump(to_dict(config, omit), sort_keys=False)
    path.write_text(text, encoding="utf-8")


def field_help(cls: type) -> dict[str, str]:
    """Dotted key -> help string, for docs and `collab config` listings.

    A config class may say what a shared section's field means to it, `FIELD_HELP =
    {"sampling.n": "..."}` (GRPO's n is the group; evolve's, the branches)."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            out.update({f"{f.name}.{k}": v for k, v in field_help(hints[f.name]).items()})
        else:
            out[f.name] = f.metadata.get("help", "")
    return out | getattr(cls, "FIELD_HELP", {})


class SetValue(str):
    """The raw text of a `--set key=value`, read as YAML only once its field's type is known.

    Text fields keep it verbatim (`--set host=::` is an address, not a YAML mapping).
    """


def _parse_set(assignment: str) -> dict[str, Any]:
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set '{assignment}' is not key=value", "write e.g. --set sampling.n=8")
    value = SetValue(raw)
    nested: dict[str, Any] = {}
    node = nested
    parts = key.strip().split(".")
    if len(parts) > MAX_DEPTH:
        raise UserError(
            f"--set key '{key[:40]}…' is {len(parts)} levels deep, over {MAX_DEPTH}",
            "write e.g. --set sampling.n=8",
        )
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return nested


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)  # never alias (and later mutate) a caller's dict


def _from_dict(cls: type[T], data: dict[str, Any], prefix: str) -> T:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known, key=str)  # YAML keys may be ints or bools
    if unknown:
        raise UserError(
            f"unknown config key '{prefix}{unknown[0]}'",
            f"known keys under '{prefix or 'top level'}': {', '.join(sorted(known))}",
        )
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        key = f"{prefix}{f.name}"
        kind = hints[f.name]
        if is_dataclass(kind):
            if isinstance(data[f.name], SetValue):  # `--set engine={kind: vllm}`
                raise UserError(
                    f"--set {key}=…: {key} is a section of keys; --set sets one at a time",
                    f"write e.g. --set {key}.{fields(kind)[0].name}=VALUE, once per key",
                )
            if not isinstance(data[f.name], dict):
                raise UserError(f"config key '{key}' must be a mapping", "see `collab --help`")
            # Keys not given keep the field's own default (SamplingConfig(max_tokens=256)
            # in one config, another elsewhere), not the nested class's defaults.
            merged = to_dict(_default_of(f))
            _deep_merge(merged, data[f.name])
            kwargs[f.name] = _from_dict(kind, merged, prefix=f"{key}.")
        else:
            kwargs[f.name] = _coerce(data[f.name], kind, key)
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise UserError(f"incomplete config for {prefix or cls.__name__}: {err}") from err


def _default_of(f: dataclasses.Field) -> Any:
    """A field's default value (built fresh from its factory, when it has one)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _coerce(value: Any, kind: Any, key: str) -> Any:
    """Check `value` against the annotation `kind`, allowing int -> float and str -> Path."""
    if isinstance(value, SetValue):
        value = _read_set_value(value, kind, key)
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        for option_kind in options:
            if option_kind is type(None):
                continue
            try:
                return _coerce(value, option_kind, key)
            except UserError:
                continue
        raise _type_error(key, value, kind)
    if origin is list:
        (item_kind,) = typing.get_args(kind)
        if not isinstance(value, list):
            raise _type_error(key, value, kind)
        return [_coerce(v, item_kind, key) for v in value]
    if origin is dict:
        key_kind, value_kind = typing.get_args(kind)
        if not isinstance(value, dict):
            raise _type_error(key, value, kind)
        # Values may still be `--set` text: `--set engine.chat_template_kwargs.x=false`.
        return {
            _coerce(k, key_kind, key): _coerce(v, value_kind, f"{key}.{k}")
            for k, v in value.items()
        }
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is Path and isinstance(value, str):
        return Path(value)
    if kind is str and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # YAML reads `--set model=7` as an int
    if kind is Any or (isinstance(kind, type) and isinstance(value, kind)):
        if kind is int and isinstance(value, bool):
            raise _type_error(key, value, kind)
        return value
    raise _type_error(key, value, kind)


def _read_set_value(raw: SetValue, kind: Any, key: str) -> Any:
    is_union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    options = typing.get_args(kind) if is_union else (kind,)
    try:
        parsed = yaml.load(raw, Loader=BoundedLoader) if raw.strip() else None
    except yaml.YAMLError as err:
        if str in options:
            return str(raw)
        shown = raw if len(raw) <= 60 else f"{raw[:60]}…"
        raise UserError(f"--set {key}={shown} is not a valid value", "quote it or fix it") from err
    if str in options and not (parsed is None and type(None) in options):
        return str(raw)
    return parsed


def _type_error(key: str, value: Any, kind: Any) -> UserError:
    name = getattr(kind, "__name__", str(kind))
    return UserError(f"config key '{key}' must be {name}, got {value!r}", "fix the value")


# -- checks and listings ----------------------------------------------------------


def check_sections(cls: type, path: Path) -> None:
    """Refuse a config file in which a section of `cls` is not a mapping (`sampling: 5`).

    Layers merge key by key, so a later layer's `sampling: {n: 4}` would replace the scalar
    and the mistake would pass unseen. The error names the file and line.
    """
    text = read_user_text(path, "config", MAX_CONFIG_BYTES)
    node = load_yaml(text, f"config {path}", "fix the file", BoundedLoader.get_single_node)
    if isinstance(node, yaml.MappingNode):
        _check_section_nodes(cls, node, str(path), prefix="")


def _check_section_nodes(cls: type, node: yaml.MappingNode, path: str, prefix: str) -> None:
    hints = typing.get_type_hints(cls)
    renamed = getattr(cls, "RENAMED", {})
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or not is_dataclass(hints.get(key_node.value)):
            continue  # not a section: _from_dict checks plain keys and values
        if key_node.value in renamed and isinstance(value_node, yaml.ScalarNode):
            continue  # a scalar that became this section (`engine: vllm`): still read
        key = f"{prefix}{key_node.value}"
        if not isinstance(value_node, yaml.MappingNode):
            shown = repr(value_node.value) if isinstance(value_node, yaml.ScalarNode) else "a list"
            raise UserError(
                f"{path}:{value_node.start_mark.line + 1}: config section '{key}' must be a "
                f"mapping of its keys, got {shown}",
                f"indent its keys below '{key_node.value}:'",
            )
        _check_section_nodes(hints[key_node.value], value_node, path, prefix=f"{key}.")


def describe_config(config: Any, expanded: dict[str, Any] | None = None) -> str:
    """`config` as YAML with every field's help as a comment above it; `expanded` (dotted
    key -> dataclass) shows a mapping field as that dataclass's fields, with their help
    (a plugin protocol's `protocol.options`).

    What `collab config show` prints; the text is itself a valid `--config` file.
    """
    lines = _describe_lines(config, field_help(type(config)), expanded=expanded or {})
    return "\n".join(lines) + "\n"


def _describe_lines(
    config: Any, helps: dict[str, str], prefix: str = "", expanded: dict[str, Any] | None = None
) -> list[str]:
    lines: list[str] = []
    indent = "  " * prefix.count(".")
    for f in fields(config):
        key = prefix + f.name
        value = (expanded or {}).get(key, getattr(config, f.name))
        # A section's own line has its field's help; its fields, the dotted keys' helps.
        lines.append(f"{indent}# {helps.get(key, f.metadata.get('help', ''))}")
        if is_dataclass(value):
            lines.append(f"{indent}{f.name}:")
            lines.extend(_describe_lines(value, helps, f"{key}.", expanded))
        else:
            lines.append(f"{indent}{f.name}: {inline_yaml(value)}")
    return lines


def inline_yaml(value: Any) -> str:
    """`value` as YAML on one line (a multi-line text is double-quoted with escapes)."""
    multiline = isinstance(value, str) and len(value.splitlines()) > 1
    text = yaml.safe_dump(
        value,
        default_flow_style=True,
        default_style='"' if multiline else None,
        width=float("inf"),
        allow_unicode=True,
    )
    return text.removesuffix("...\n").strip()
