"""Fixtures for the KV transfer tests: the engine tests' tiny random Llama and
DeepSeek-V3 (transformers-written, once per session)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_ENGINE_HELPERS = str(Path(__file__).resolve().parent.parent / "engine")
if _ENGINE_HELPERS not in sys.path:
    sys.path.insert(0, _ENGINE_HELPERS)

from engine_models import build_model_dir  # noqa: E402


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "llama", "llama")


@pytest.fixture(scope="session")
def deepseek_v3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "deepseek_v3", "deepseek_v3")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest single-threaded on a shared machine; restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
