"""FP8 kernels: quantisation (the reference's, already vectorised fp32 torch) and the
scaled matmul, dequantised to fp32 for one GEMM."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...reference.kernels import KERNELS as REFERENCE_KERNELS
from ._fp8 import dequantise_blocks
from ._registry import KERNELS

#: DeepSeek's block scales: 1x128 groups of activations, 128x128 tiles of weights.
BLOCK = 128

KERNELS.add(REFERENCE_KERNELS.get("quantize_fp8"))


@KERNELS.register("scaled_mm")
def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    scale_mode: str,
    out_dtype: torch.dtype,
    out: torch.Tensor,
) -> None:
    """(a * a_scale) @ (b * b_scale)^T (+ bias) in fp32, rounded once to out's dtype.
    Tensor and row scales factor out of the sum, so they scale the product instead."""
    if scale_mode == "block":
        product = F.linear(dequantise_blocks(a, a_scale, 1, BLOCK), dequantise_blocks(b, b_scale, BLOCK, BLOCK))
    else:
        product = F.linear(a.float(), b.float()).mul_(a_scale).mul_(b_scale.T)
    if bias is not None:
        product.add_(bias)
    out.copy_(product)
