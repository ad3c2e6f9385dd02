"""Hub names (`org/name`) resolve from the local Hugging Face cache, never downloading.

The caches here are laid out as huggingface_hub writes them (refs/, snapshots/ and
blobs/), with the tiny model's files as the snapshot's, so the folder a name resolves
to is one transformers really loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from collabrl.errors import UserError
from collabrl.models import (
    cached_models,
    hf_hub_cache,
    hub_commit,
    load_model,
    load_tokenizer,
    pinned,
    resolve_model,
    with_revision,
)

REPO = "tiny-org/tiny-llama"


def fake_hub_cache(
    cache: Path,
    repo: str,
    model: Path,
    *,
    symlinks: bool = True,
    files: tuple[str, ...] = (),
    ref: str = "main",
) -> Path:
    """Put `model`'s files (only `files`, when given) into the hub cache `cache` as the
    snapshot `refs/REF` names; return the snapshot folder. `symlinks`: each snapshot
    file links to its blob, as huggingface_hub stores them where it can; otherwise plain
    copies (Windows, or a cache copied with `cp -L`). Called again with another `ref`,
    it adds a second snapshot to the same repo."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo}@{ref}".encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for file in sorted(model.iterdir()):
        if files and file.name not in files:
            continue
        if symlinks:
            blob = folder / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
            shutil.copyfile(file, blob)
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
        else:
            shutil.copyfile(file, snapshot / file.name)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache that HF_HUB_CACHE points at."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize("symlinks", [True, False], ids=["blob symlinks", "plain files"])
def test_a_hub_name_resolves_to_its_cached_snapshot(
    symlinks: bool, hub_cache: Path, tiny_model_dir: Path
) -> None:
    snapshot = fake_hub_cache(hub_cache, REPO, tiny_model_dir, symlinks=symlinks)
    ref = resolve_model(REPO)
    assert (ref.name, ref.kind, ref.source) == (REPO, "hf", snapshot.resolve())


def test_a_cached_hub_model_loads_and_generates(hub_cache: Path, tiny_model_dir: Path) -> None:
    fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    tokenizer = load_tokenizer(REPO)
    model = load_model(REPO)
    ids = tokenizer("2 + 2 =", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] == ids.shape[1] + 2


def test_hf_home_is_the_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert hf_hub_cache() == tmp_path / "hf-home" / "hub"
    snapshot = fake_hub_cache(tmp_path / "hf-home" / "hub", REPO, tiny_model_dir)
    assert resolve_model(REPO).source == snapshot.resolve()


def test_without_any_variable_the_cache_is_under_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"


def test_a_revision_picks_that_snapshot(hub_cache: Path, tiny_model_dir: Path) -> None:
    snapshot = fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    tagged = fake_hub_cache(hub_cache, REPO, tiny_model_dir, ref="v2")
    assert resolve_model(f"{REPO}@{snapshot.name}").source == snapshot.resolve()
    assert resolve_model(f"{REPO}@main").source == snapshot.resolve()
    assert resolve_model(f"{REPO}@v2").source == tagged.resolve()
    assert resolve_model(REPO).source == snapshot.resolve()  # main, as from_pretrained


def test_a_revision_not_in_the_cache_says_which_are(hub_cache: Path, tiny_model_dir: Path) -> None:
    """Before, `org/name@v2` said the model was not in the cache at all."""
    snapshot = fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    with pytest.raises(UserError) as info:
        resolve_model(f"{REPO}@v3")
    assert info.value.problem == (
        f"'{REPO}@v3': the Hugging Face cache {hub_cache} holds {REPO}, but not its revision "
        f"'v3' (it holds main = {snapshot.name})"
    )
    assert f"hf download {REPO} --revision v3" in str(info.value.fix)


@pytest.mark.parametrize("base", ["smollm2-135m", "local"], ids=["embedded", "local folder"])
def test_a_revision_of_an_embedded_model_or_a_folder_is_refused(
    base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").mkdir()
    with pytest.raises(UserError) as info:
        resolve_model(f"{base}@v2")
    assert info.value.problem.startswith(f"'{base}@v2': a revision (@v2) picks a snapshot")
    assert info.value.fix == f"pass '{base}' without a revision"


def test_with_revision_applies_to_hub_names_only() -> None:
    assert with_revision(REPO, "v2") == f"{REPO}@v2"
    assert with_revision(f"{REPO}@v2", "v2") == f"{REPO}@v2"
    with pytest.raises(UserError, match="already names the revision v1"):
        with_revision(f"{REPO}@v1", "v2")
    with pytest.raises(UserError, match="'smollm2-135m' is not a hub name"):
        with_revision("smollm2-135m", "v2")
    with pytest.raises(UserError, match="is not a hub name"):
        with_revision("http://127.0.0.1:8000/v1", "v2")


def test_a_hub_name_is_pinned_to_the_commit_it_loads(hub_cache: Path, tiny_model_dir: Path) -> None:
    snapshot = fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    tagged = fake_hub_cache(hub_cache, REPO, tiny_model_dir, ref="v2")
    assert pinned(REPO) == f"{REPO}@{snapshot.name}"
    assert pinned(f"{REPO}@v2") == f"{REPO}@{tagged.name}"
    assert hub_commit(f"{REPO}@{tagged.name}") == tagged.name
    assert pinned("smollm2-135m") == "smollm2-135m"  # one version only
    assert hub_commit(str(tiny_model_dir)) is None


def test_the_cache_listing_has_each_model_its_revisions_and_size(
    hub_cache: Path, tiny_model_dir: Path
) -> None:
    snapshot = fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    tagged = fake_hub_cache(hub_cache, REPO, tiny_model_dir, ref="v2")
    plain = fake_hub_cache(hub_cache, "other/plain", tiny_model_dir, symlinks=False)
    (hub_cache / "models--never--started").mkdir()  # no snapshots/: not listed
    listed = {model.name: model for model in cached_models(hub_cache)}
    assert sorted(listed) == ["other/plain", REPO]
    assert listed[REPO].snapshots == {snapshot.name: ["main"], tagged.name: ["v2"]}
    weights = sum(file.stat().st_size for file in tiny_model_dir.iterdir())
    assert listed[REPO].size > weights  # the blobs, counted once, and the refs
    assert listed[REPO].size < 2 * weights  # the two snapshots share their blobs
    assert listed["other/plain"].snapshots == {plain.name: ["main"]}
    assert listed["other/plain"].size > weights  # plain copies count


def test_a_ref_that_is_a_fifo_marks_its_model_damaged_without_blocking(
    hub_cache: Path, tiny_model_dir: Path
) -> None:
    fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    ref = hub_cache / "models--tiny-org--tiny-llama" / "refs" / "main"
    ref.unlink()
    os.mkfifo(ref)
    (listed,) = cached_models(hub_cache)
    assert (
        listed.problem
        == f"cannot read cache ref {ref}: not a regular file (a folder, FIFO or device)"
    )


def test_a_hub_name_not_in_the_cache_says_where_it_looked(hub_cache: Path) -> None:
    with pytest.raises(UserError) as info:
        resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    message = str(info.value)
    assert info.value.problem.startswith("unknown model 'Qwen/Qwen2.5-0.5B-Instruct'")
    assert str(hub_cache) in info.value.problem
    assert "nothing is downloaded" in info.value.problem
    assert "\n" not in message
    assert list(hub_cache.iterdir()) == []  # not even a folder was made for it


def test_a_local_folder_of_the_same_spelling_wins(
    hub_cache: Path, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    work = tmp_path / "work"
    local = work / REPO
    local.mkdir(parents=True)
    for file in tiny_model_dir.iterdir():
        (local / file.name).symlink_to(file)
    monkeypatch.chdir(work)
    assert resolve_model(REPO).source == local.resolve()


def test_a_cached_snapshot_without_weights_is_refused(
    hub_cache: Path, tiny_model_dir: Path
) -> None:
    # What `AutoConfig.from_pretrained` alone leaves in the cache.
    fake_hub_cache(hub_cache, REPO, tiny_model_dir, files=("config.json",))
    with pytest.raises(UserError, match=f"'{REPO}' has a config.json but no weights"):
        resolve_model(REPO)


def test_a_url_is_never_looked_up_in_the_cache(hub_cache: Path) -> None:
    with pytest.raises(UserError) as info:
        resolve_model("http://127.0.0.1:8000/v1")
    assert "Hugging Face cache" not in info.value.problem


# --- a damaged cache, or one that points elsewhere: one line, before anything loads ---------------


def _weights(snapshot: Path) -> Path:
    return snapshot / "model.safetensors"


def _dangling(snapshot: Path) -> None:
    _weights(snapshot).resolve().unlink()  # its blob is gone: a download cut off, a cleanup


def _cut_short(snapshot: Path) -> None:
    blob = _weights(snapshot).resolve()
    blob.write_bytes(blob.read_bytes()[:1000])


def _fifo(snapshot: Path) -> None:
    _weights(snapshot).unlink()
    os.mkfifo(_weights(snapshot))  # reading it would wait for a writer forever


def _endless(snapshot: Path) -> None:
    _weights(snapshot).unlink()
    _weights(snapshot).symlink_to("/dev/zero")  # reading it would never end


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (_dangling, "model.safetensors in {snapshot} cannot be read (No such file"),
        (_cut_short, "model.safetensors in {snapshot} is cut short or is not safetensors"),
        (_fifo, "model.safetensors in {snapshot} is not a regular file (a FIFO or device)"),
        (_endless, "model.safetensors in {snapshot} is not a regular file (a FIFO or device)"),
    ],
    ids=["dangling blob link", "cut short", "FIFO", "/dev/zero"],
)
def test_damaged_weights_in_the_cache_are_one_line(
    damage, problem: str, hub_cache: Path, tiny_model_dir: Path
) -> None:
    """Before, each resolved (a glob found the name) and failed as the model loaded, with
    a traceback, after the run had written its folder."""
    snapshot = fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    damage(snapshot)
    with pytest.raises(UserError) as info:
        resolve_model(REPO)
    assert info.value.problem.startswith(f"'{REPO}': " + problem.format(snapshot=snapshot))
    assert info.value.fix == f"download it again where there is network: `hf download {REPO}`"


@pytest.mark.parametrize("revision", ["..", ".", "main/../..", "refs/"])
def test_a_revision_that_is_a_path_is_refused(
    revision: str, hub_cache: Path, tiny_model_dir: Path
) -> None:
    """Before, `@..` and `@.` read refs/.. (a folder): an IsADirectoryError traceback."""
    fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    with pytest.raises(UserError, match=f"the revision '{re.escape(revision)}' is not a branch"):
        resolve_model(f"{REPO}@{revision}")


def test_a_ref_that_points_outside_the_cache_is_refused(
    hub_cache: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Before, refs/main holding `../../../elsewhere` loaded whatever model was there."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(tiny_model_dir, elsewhere)
    fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    ref = hub_cache / "models--tiny-org--tiny-llama" / "refs" / "main"
    ref.write_text(os.path.relpath(elsewhere, ref.parent.parent / "snapshots"))
    with pytest.raises(UserError) as info:
        resolve_model(REPO)
    assert info.value.problem == (
        f"'{REPO}': {ref} holds no commit hash (the Hugging Face cache is damaged)"
    )


@pytest.mark.parametrize("shard", ["model-00002-of-00002.safetensors", "../../elsewhere.bin"])
def test_an_index_naming_a_shard_not_in_the_snapshot_is_refused(
    shard: str, hub_cache: Path, tiny_model_dir: Path
) -> None:
    snapshot = fake_hub_cache(hub_cache, REPO, tiny_model_dir)
    index = {"weight_map": {"a": "model.safetensors", "b": shard}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match=f"model.safetensors.index.json names {re.escape(shard)}"):
        resolve_model(REPO)
