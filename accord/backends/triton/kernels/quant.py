"""quant_linear has no Triton kernel yet: the GPU backends serve it with the reference
kernel (plain, device-agnostic torch: the GGUF blocks dequantised in fp64, then an fp64
GEMM), so a GGUF file loads packed there too. Conformance reports it as shared with the
reference, never as passed, until a Triton kernel replaces it."""

from __future__ import annotations

from ...reference.kernels import KERNELS as REFERENCE_KERNELS
from ._registry import KERNELS

REFERENCE = REFERENCE_KERNELS.get("quant_linear")
assert REFERENCE is not None, "the reference backend lost its quant_linear kernel"
KERNELS.add(REFERENCE)
