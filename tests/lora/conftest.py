"""Fixtures for the multi-LoRA tests: the engine tests' tiny random Llama, a tiny random
Qwen3, and PEFT adapters for them with random non-zero A and B (tests/engine is put on
sys.path, so this directory runs on its own too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_ENGINE_HELPERS = str(Path(__file__).resolve().parent.parent / "engine")
if _ENGINE_HELPERS not in sys.path:
    sys.path.insert(0, _ENGINE_HELPERS)

from engine_fixtures import llama_dir, one_torch_thread  # noqa: E402, F401 (fixtures)
from engine_models import write_tokenizer  # noqa: E402
from lora_helpers import ADAPTER_A, ADAPTER_B, make_adapter  # noqa: E402

@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 (per-head q/k norms) with the demo tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    directory = tmp_path_factory.mktemp("models") / "qwen3"
    directory.mkdir()
    vocab_size, bos_id, eos_id = write_tokenizer(directory)
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, bos_token_id=bos_id, eos_token_id=eos_id,
        initializer_range=0.2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).float().eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def llama_adapters(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: F811 (the imported fixture, as a parameter)
    root = tmp_path_factory.mktemp("llama-adapters")
    return {"a": make_adapter(llama_dir, root / "a", seed=1, **ADAPTER_A),
            "b": make_adapter(llama_dir, root / "b", seed=2, **ADAPTER_B)}


@pytest.fixture(scope="session")
def qwen3_adapters(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3-adapters")
    return {"a": make_adapter(qwen3_dir, root / "a", seed=3, **ADAPTER_A),
            "b": make_adapter(qwen3_dir, root / "b", seed=4, **ADAPTER_B)}

