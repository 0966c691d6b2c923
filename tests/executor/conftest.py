"""Fixtures for the executor tests: the engine tests' tiny random models and the server
tests' `accord serve` harness (tests/engine and tests/server are put on sys.path, so
this directory runs on its own too)."""

from __future__ import annotations

import sys
from pathlib import Path

for _helpers in ("engine", "server"):
    _directory = str(Path(__file__).resolve().parent.parent / _helpers)
    if _directory not in sys.path:
        sys.path.insert(0, _directory)

from engine_fixtures import deepseek_v3_dir, llama_dir  # noqa: E402, F401 (fixtures)
