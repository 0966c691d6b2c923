"""The rocm backend: AMD GPUs, the shared Triton kernels on HIP plus torch's vendor fast
paths (torch._scaled_mm on hipBLASLt), with rccl for torch.distributed. The fp8 format
follows the architecture: e4m3fnuz on gfx94x (MI300-class), e4m3fn on gfx95x."""

from __future__ import annotations

import torch

from ..triton.gpu_backend import GpuBackend


class RocmBackend(GpuBackend):
    """AMD GPUs through torch's HIP build (exposed as "cuda" devices)."""

    name = "rocm"
    priority = 40
    # RCCL; torch.distributed reaches it through its "nccl" backend name on ROCm builds.
    dist_backend = "rccl"

    def process_group_backend(self) -> str:
        return "nccl"
    vendor = "AMD"
    description = "AMD GPUs (Triton kernels on HIP, torch._scaled_mm)"

    def runtime_missing(self) -> str | None:
        if getattr(torch.version, "hip", None) is None:
            return f"this torch build ({torch.__version__}) has no ROCm/HIP support"
        return None
