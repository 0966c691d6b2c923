"""Fixtures for the reasoning tests: tiny random reasoning models (DeepSeek-R1's and
Qwen3's chat templates, `<think>`/`</think>` as added tokens), written once per session,
and one engine per model."""

from __future__ import annotations

from pathlib import Path

import pytest
from reasoning_models import write_reasoning_model


@pytest.fixture(scope="session")
def r1_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reasoning_model(tmp_path_factory.mktemp("reasoning") / "r1", "deepseek_r1")


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reasoning_model(tmp_path_factory.mktemp("reasoning") / "qwen3", "qwen3")


@pytest.fixture(scope="session")
def r1_llm(r1_dir: Path):
    from accord import LLM

    return LLM(str(r1_dir), max_model_len=256)
