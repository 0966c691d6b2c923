"""The cuda backend: NVIDIA GPUs, the shared Triton kernels plus torch's vendor fast
paths (torch._scaled_mm), with nccl for torch.distributed."""

from __future__ import annotations

import torch

from ..triton.gpu_backend import GpuBackend


class CudaBackend(GpuBackend):
    """NVIDIA GPUs through torch.cuda."""

    name = "cuda"
    priority = 40
    dist_backend = "nccl"
    vendor = "NVIDIA"
    description = "NVIDIA GPUs (Triton kernels, torch._scaled_mm)"

    def runtime_missing(self) -> str | None:
        if torch.version.cuda is None:
            return f"this torch build ({torch.__version__}) has no CUDA support"
        return None
