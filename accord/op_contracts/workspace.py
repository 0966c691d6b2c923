"""Grow-only scratch buffers reused from call to call, on any device.

A fresh tensor of tens of megabytes is mmap'd by glibc and page-faulted on every call,
which costs several times the copy that fills it (a 50 MB KV gather: ~100 ms fresh,
~25 ms into a reused buffer). The cpu kernels gather into these buffers, and the
rejection sampler pads its logits into one. They hold intermediates only, never an op's
outputs. It lives here, beside the contracts, because both core and the backends may
import this package and nothing else of each other.
"""

from __future__ import annotations

import math

import torch


class Workspace:
    """Named scratch buffers, one per (name, dtype, device), grown to the largest request."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def take(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """An uninitialised contiguous tensor of `shape` backed by the named buffer; it
        stays valid until the next `take` of the same name, dtype and device."""
        numel = math.prod(shape)
        key = (name, dtype, torch.device(device))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            # A normal (not inference) tensor: writable both inside and outside
            # torch.inference_mode, whichever the first caller happened to run under.
            with torch.inference_mode(False):
                buffer = torch.empty(numel, dtype=dtype, device=key[2])
            self._buffers[key] = buffer
        return buffer[:numel].view(shape)
