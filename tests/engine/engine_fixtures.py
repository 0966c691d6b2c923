"""Session fixtures over the tiny random models of engine_models, for any test folder
whose conftest imports them (pytest takes fixtures a conftest imports). A uniquely
named module, so tests import it whatever else pytest collected."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_models import build_model_dir


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "llama", "llama")


@pytest.fixture(scope="session")
def deepseek_v3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "deepseek_v3", "deepseek_v3")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest single-threaded, above all on a shared, loaded machine
    (torch's worker threads spin against each other); restored after the module."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
