"""Grow-only scratch buffers the cpu kernels reuse from call to call.

A fresh tensor of tens of megabytes is mmap'd by glibc and page-faulted on every call,
which costs several times the copy that fills it (a 50 MB KV gather: ~100 ms fresh,
~25 ms into a reused buffer). Kernels gather into these buffers instead. They hold
intermediates only, never a kernel's outputs, and make the kernels non-reentrant
across threads, as the engine's one-thread-per-process model runner already is.
"""

from __future__ import annotations

import math

import torch


class Workspace:
    """Named scratch buffers, one per (name, dtype), grown to the largest request."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor of `shape` backed by the named buffer; it
        stays valid until the next `take` of the same name and dtype."""
        numel = math.prod(shape)
        buffer = self._buffers.get((name, dtype))
        if buffer is None or buffer.numel() < numel:
            # A normal (not inference) tensor: writable both inside and outside
            # torch.inference_mode, whichever the first caller happened to run under.
            with torch.inference_mode(False):
                buffer = torch.empty(numel, dtype=dtype)
            self._buffers[(name, dtype)] = buffer
        return buffer[:numel].view(shape)


#: The process-wide workspace of the cpu kernels.
WORKSPACE = Workspace()
