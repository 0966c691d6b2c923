"""The quant tests write tiny GGUF files with the GGUF tests' writer (tests/gguf) and
reuse the distributed tests' two-rank helpers (tests/distributed): those directories go
on sys.path here (spawned ranks inherit it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from accord.core.model_loader.gguf.source import PACKED_ENV

TESTS = Path(__file__).resolve().parent.parent
for directory in ("gguf", "distributed", "models", "engine", "executor"):
    path = str(TESTS / directory)
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.fixture(autouse=True)
def packed_gguf(monkeypatch: pytest.MonkeyPatch) -> None:
    """GGUF linear weights load packed in these tests (ACCORD_GGUF_PACKED=1, the default,
    set whatever the environment says); a test that wants the dequantised path sets it to 0."""
    monkeypatch.setenv(PACKED_ENV, "1")
