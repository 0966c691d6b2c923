"""The distributed tests reuse other test directories' helpers: the model tests' tiny
transformers checkpoints (tests/models), the engine tests' tokenizer and transformers
greedy reference (tests/engine), the mp executor tests' pressure settings
(tests/executor) and the GGUF tests' file writer (tests/gguf). Those directories are
put on sys.path here so this one runs on its own too; spawned ranks inherit sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for directory in ("models", "engine", "executor", "gguf"):
    path = str(TESTS / directory)
    if path not in sys.path:
        sys.path.insert(0, path)
