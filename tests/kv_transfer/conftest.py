"""Fixtures for the KV transfer tests: the engine tests' tiny random Llama and
DeepSeek-V3 (tests/engine is put on sys.path, so this directory runs on its own too)."""

from __future__ import annotations

import sys
from pathlib import Path

_ENGINE_HELPERS = str(Path(__file__).resolve().parent.parent / "engine")
if _ENGINE_HELPERS not in sys.path:
    sys.path.insert(0, _ENGINE_HELPERS)

from engine_fixtures import deepseek_v3_dir, llama_dir, one_torch_thread  # noqa: E402, F401 (fixtures)
