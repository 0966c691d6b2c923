"""Registers the built-in backends through the same hook third-party plugins use."""

from __future__ import annotations

from .ascend import AscendBackend
from .base import Backend
from .cpu import CpuBackend
from .cuda import CudaBackend
from .hookspecs import hookimpl
from .reference import ReferenceBackend
from .rocm import RocmBackend
from .triton import TritonBackend


@hookimpl
def accord_backends() -> list[Backend]:
    """The built-ins; constructing them imports no vendor runtime."""
    return [ReferenceBackend(), CpuBackend(), TritonBackend(), CudaBackend(), RocmBackend(), AscendBackend()]
