"""Which dtype the cpu kernels compute in."""

from __future__ import annotations

import torch

from .. import capability


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to run matmuls and attention in for inputs of `dtype`: the dtype itself
    where the CPU computes it natively, else fp32 (emulated bf16 GEMMs are ~200x slower
    than fp32 ones on AVX2-only CPUs, and fp32 is at least as accurate)."""
    if dtype in (torch.bfloat16, torch.float16) and capability.cpu_has_native_bf16():
        return dtype
    return torch.float32
