"""Fixtures for the executor tests: the engine tests' tiny random models (their
builder, tests/engine/engine_models.py, is put on sys.path so this directory runs on
its own too), and a check that no worker process outlives its test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ENGINE_TESTS = str(Path(__file__).resolve().parent.parent / "engine")
if ENGINE_TESTS not in sys.path:
    sys.path.insert(0, ENGINE_TESTS)

from engine_models import build_model_dir  # noqa: E402


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "llama", "llama")


@pytest.fixture(scope="session")
def deepseek_v3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "deepseek_v3", "deepseek_v3")
