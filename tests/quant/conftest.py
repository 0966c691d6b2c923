"""The quant tests write tiny GGUF files with the GGUF tests' writer (tests/gguf) and
reuse the distributed tests' two-rank helpers (tests/distributed): those directories go
on sys.path here (spawned ranks inherit it)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for directory in ("gguf", "distributed", "models", "engine", "executor"):
    path = str(TESTS / directory)
    if path not in sys.path:
        sys.path.insert(0, path)
