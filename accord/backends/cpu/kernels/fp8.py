"""FP8 kernels: quantisation (fp32 scales per tensor, token or 128-wide group) and the
scaled matmul, dequantised to fp32 for one GEMM."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ....op_contracts import FP8_MAX
from ._fp8 import dequantise_blocks
from ._registry import KERNELS

#: DeepSeek's block scales: 1x128 groups of activations, 128x128 tiles of weights.
BLOCK = 128
#: The contract's floor on amax, so an all-zero granule (padding) gets a finite scale.
AMAX_FLOOR = 1e-10


def _granule_amax(magnitude: torch.Tensor, mode: str, group_size: int) -> torch.Tensor:
    """max |x| of each granule, shaped like the scales (an empty granule: 0)."""
    tokens, hidden = magnitude.shape
    if mode == "per_tensor":
        return magnitude.amax().reshape(1, 1) if magnitude.numel() else magnitude.new_zeros(1, 1)
    if hidden == 0:
        return magnitude.new_zeros(tokens, 1 if mode == "per_token" else 0)
    if mode == "per_token":
        return magnitude.amax(dim=1, keepdim=True)
    # A partial last group is filled with zeros, which never raise a max of |x|.
    groups = -(-hidden // group_size)
    if groups * group_size != hidden:
        magnitude = F.pad(magnitude, (0, groups * group_size - hidden))
    return magnitude.view(tokens, groups, group_size).amax(dim=2)


@KERNELS.register("quantize_fp8")
def quantize_fp8(
    x: torch.Tensor,
    scale: torch.Tensor | None,
    mode: str,
    group_size: int,
    fp8_dtype: torch.dtype,
    q: torch.Tensor,
    scales: torch.Tensor,
) -> None:
    """Dynamic scales max(amax, floor) / FP8_MAX (or the static one), then x / scale
    in fp32, saturated and rounded once to fp8."""
    limit = FP8_MAX[fp8_dtype]
    x32 = x.float()
    if scale is None:
        torch.div(_granule_amax(x32.abs(), mode, group_size).clamp_min_(AMAX_FLOOR), limit, out=scales)
    else:
        scales.copy_(scale)
    if mode == "per_group":
        per_element = scales.repeat_interleave(group_size, dim=1)[:, : x.shape[1]]
    else:
        per_element = scales  # (1, 1) and (T, 1) broadcast over the row
    q.copy_(torch.div(x32, per_element).clamp_(-limit, limit))


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
