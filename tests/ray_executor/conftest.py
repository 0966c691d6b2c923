"""Fixtures for the Ray executor tests: one local Ray cluster for the whole session
(Ray starts slowly), the engine tests' tiny random Llama, and the server tests'
`accord serve` harness (tests/engine, tests/server and tests/executor are put on
sys.path, so this directory runs on its own too).

Tests that need Ray carry the `ray` mark: CI installs `accord[ray]` and runs them in a
step of their own (`pytest -n 0 -m ray tests`) so the session cluster is shared."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _helpers in ("engine", "server", "executor"):
    _directory = str(Path(__file__).resolve().parent.parent / _helpers)
    if _directory not in sys.path:
        sys.path.insert(0, _directory)

from engine_models import build_model_dir  # noqa: E402

#: Logical CPUs of the test cluster: two TP=2 CPU deployments fit at once.
CLUSTER_CPUS = 4


@pytest.fixture(scope="session")
def ray_installed() -> Any:
    """The `ray` module; skips, saying why, where it is not installed."""
    return pytest.importorskip(
        "ray", reason="Ray is not installed: pip install 'accord[ray]' (CI installs it and runs these with -m ray)"
    )


@pytest.fixture(scope="session")
def ray_cluster(ray_installed: Any) -> Iterator[Any]:
    """A local Ray cluster this process is connected to (the executor uses the
    connection it finds); the `ray` module."""
    ray = ray_installed
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=CLUSTER_CPUS, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("models") / "llama", "llama")
