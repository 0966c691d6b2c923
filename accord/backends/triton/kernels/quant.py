"""quant_linear, quant_embedding and group_quant_linear have no Triton kernels yet: the
GPU backends serve them with the reference kernels (plain, device-agnostic torch: the
weights dequantised in fp64 from their format's definition, then an fp64 GEMM or the
looked-up rows), so a GGUF file or an int4 checkpoint loads packed there too. Conformance reports them as shared with the
reference, never as passed, until Triton kernels replace them."""

from __future__ import annotations

from ...reference.kernels import KERNELS as REFERENCE_KERNELS
from ._registry import KERNELS

for _op in ("quant_linear", "quant_embedding", "group_quant_linear"):
    _reference = REFERENCE_KERNELS.get(_op)
    assert _reference is not None, f"the reference backend lost its {_op} kernel"
    KERNELS.add(_reference)
