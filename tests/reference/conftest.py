"""Fixtures for the reference backend's tests: a strict dispatcher on the golden."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.op_contracts import OpDispatcher


@pytest.fixture(scope="session")
def ops() -> OpDispatcher:
    """The reference backend behind a dispatcher that validates every call."""
    return OpDispatcher(get_backend("reference"), strict=True)


@pytest.fixture(autouse=True)
def seeded() -> None:
    """Every test draws the same random inputs on every run."""
    torch.manual_seed(0)
