"""quant_linear, quant_embedding and group_quant_linear have no torch-npu kernels yet
(npu_weight_quant_batchmatmul takes other layouts than GGUF blocks, and is not wired to
the group-quantised one yet): the backend serves them with the reference kernels (plain
torch: the weights dequantised in fp64, then an fp64 GEMM or the looked-up rows), which
conformance reports as shared with the reference, never as passed."""

from __future__ import annotations

from ....op_contracts import KernelSet
from ...reference.kernels import KERNELS as REFERENCE_KERNELS

SHARED_OPS = ("quant_linear", "quant_embedding", "group_quant_linear")


def register(kernels: KernelSet) -> None:
    """Add the reference's GGUF and group-quantised kernels."""
    for op in SHARED_OPS:
        reference = REFERENCE_KERNELS.get(op)
        assert reference is not None, f"the reference backend lost its {op} kernel"
        kernels.add(reference)
