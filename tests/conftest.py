"""Shared fixtures: a tiny random Llama with the real SmolLM2 tokenizer.

The tiny model loads in well under a second and generates fast on a CPU, so
engine and eval-runner tests exercise real transformers generation instead of
mocks. Its weights are random, but seeded, so its outputs are deterministic.

`engine: auto` is pinned to the transformers engine for the whole run (subprocesses
included), so that results do not depend on whether vLLM is installed; the vLLM
paths have their own tests (tests/engines/test_vllm_real.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from collabrl.engines import AUTO_ENGINE_ENV

os.environ[AUTO_ENGINE_ENV] = "transformers"

EMBEDDED = "smollm2-135m"


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The real SmolLM2 tokenizer (converting the embedded GGUF on first use)."""
    from collabrl.models import load_tokenizer

    return load_tokenizer(EMBEDDED)


def write_tiny_llama(tokenizer, folder: Path, **dims: Any) -> Path:
    """Save a tiny random LlamaForCausalLM with `tokenizer` into `folder`; `dims`
    override its sizes (LlamaConfig keys)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    sizes = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 2048,
        # Wider than the default 0.02: varied greedy text with clear top-1 margins,
        # where the default init mostly repeats the last prompt token.
        "initializer_range": 0.2,
    }
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        **(sizes | dims),
        **ids,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer) -> Path:
    """A local Hugging Face folder holding a tiny random LlamaForCausalLM."""
    return write_tiny_llama(smol_tokenizer, tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir: Path):
    """A TransformersEngine over the tiny model, shared by the whole session."""
    from collabrl.engines.hf import TransformersEngine

    return TransformersEngine.from_ref(str(tiny_model_dir), batch_size=4)
