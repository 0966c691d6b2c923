"""The rocm backend: AMD GPUs, the shared Triton kernels on HIP."""

from __future__ import annotations

import torch

from ...op_contracts import KernelSet
from ..base import Availability, Backend


class RocmBackend(Backend):
    """AMD GPUs through torch's HIP build."""

    name = "rocm"
    device_type = "cuda"  # torch exposes HIP devices as "cuda"
    priority = 40
    dist_backend = "rccl"
    description = "AMD GPUs (Triton kernels on HIP)"

    def availability(self) -> Availability:
        if getattr(torch.version, "hip", None) is None:
            return Availability(False, f"this torch build ({torch.__version__}) has no ROCm/HIP support")
        if not torch.cuda.is_available():
            return Availability(False, "no AMD GPU is visible (torch.cuda.is_available() is False)")
        return Availability(True)

    def load_kernels(self) -> KernelSet:
        from ..triton.kernels import KERNELS

        return KERNELS
