"""The cuda backend: NVIDIA GPUs, Triton kernels plus torch's vendor fast paths."""

from __future__ import annotations

import torch

from ...op_contracts import KernelSet
from ..base import Availability, Backend


class CudaBackend(Backend):
    """NVIDIA GPUs through torch.cuda."""

    name = "cuda"
    device_type = "cuda"
    priority = 40
    dist_backend = "nccl"
    description = "NVIDIA GPUs (Triton kernels, torch._scaled_mm, SDPA)"

    def availability(self) -> Availability:
        if torch.version.cuda is None:
            return Availability(False, f"this torch build ({torch.__version__}) has no CUDA support")
        if not torch.cuda.is_available():
            return Availability(False, "no NVIDIA GPU is visible (torch.cuda.is_available() is False)")
        return Availability(True)

    def load_kernels(self) -> KernelSet:
        from ..triton.kernels import KERNELS

        return KERNELS
