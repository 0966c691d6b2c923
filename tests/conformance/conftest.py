"""Shared setup for conformance's tests."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Conformance cases are tiny: on a shared CI box a torch thread pool only adds
    contention (runs were 5x slower with two threads), so tests use one, as the CLI does."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
