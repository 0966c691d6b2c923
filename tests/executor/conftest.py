"""Fixtures for the executor tests: the engine tests' tiny random models and the server
tests' `accord serve` harness (tests/engine and tests/server are put on sys.path, so
this directory runs on its own too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

for _helpers in ("engine", "server"):
    _directory = str(Path(__file__).resolve().parent.parent / _helpers)
    if _directory not in sys.path:
        sys.path.insert(0, _directory)

from engine_models import build_model_dir  # noqa: E402


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "llama", "llama")


@pytest.fixture(scope="session")
def deepseek_v3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "deepseek_v3", "deepseek_v3")
