"""Shared setup for the ascend backend's tests: the backend on its operator emulator."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

from accord.backends.ascend import AscendBackend


@pytest.fixture(scope="session")
def emulated() -> AscendBackend:
    """The ascend backend with its kernels calling the CPU operator emulator."""
    return AscendBackend(emulate=True)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The cases are tiny; a thread pool on a shared CI box only adds contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
