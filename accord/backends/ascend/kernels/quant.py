"""quant_linear has no torch-npu kernel yet (npu_weight_quant_batchmatmul takes other
layouts than GGUF blocks): the backend serves it with the reference kernel (plain
torch: the blocks dequantised in fp64, then an fp64 GEMM), which conformance reports as
shared with the reference, never as passed."""

from __future__ import annotations

from ....op_contracts import KernelSet
from ...reference.kernels import KERNELS as REFERENCE_KERNELS


def register(kernels: KernelSet) -> None:
    """Add the reference's quant_linear."""
    reference = REFERENCE_KERNELS.get("quant_linear")
    assert reference is not None, "the reference backend lost its quant_linear kernel"
    kernels.add(reference)
