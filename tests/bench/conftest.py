"""The bench tests' helpers: the scripted stub (stub_server.py, here) and the server
tests' `accord serve` harness (tests/server on sys.path, so this directory runs alone)."""

from __future__ import annotations

import sys
from pathlib import Path

for _helpers in (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "server"):
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))
