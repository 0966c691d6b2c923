"""The ascend backend's kernels, one module per contract family, built around the
operator namespace they call: torch_npu on an Ascend node, the emulator under
ACCORD_NPU_EMULATE=1."""

from __future__ import annotations

from typing import Any

from ....op_contracts import KernelSet
from . import attention, cache, compressed, elementwise, fp8, linear, moe, quant, sampling


def build_kernels(npu: Any) -> KernelSet:
    """Every contract's kernel, calling torch-npu's operators on `npu`."""
    kernels = KernelSet("ascend")
    for family in (elementwise, cache, attention, moe):
        family.register(kernels, npu)
    for plain in (fp8, linear, quant, sampling, compressed):
        plain.register(kernels)
    return kernels


__all__ = ["build_kernels"]
