"""RMS norm and fused residual add + RMS norm: one program per token row, fp32 math."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._numerics import rounded_like, store_rounded
from ._registry import KERNELS


@triton.jit
def _rms_norm_row(x, weight_ptr, out_ptr, cols, mask, hidden, eps):
    # x is the fp32 row (zeros where masked, so they add nothing to the mean square).
    mean_square = tl.sum(x * x, axis=0) / hidden
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    store_rounded(out_ptr + cols, x * tl.rsqrt(mean_square + eps) * weight, mask)


@triton.jit
def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, hidden, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * hidden
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    _rms_norm_row(x, weight_ptr, out_ptr + row, cols, mask, hidden, eps)


@triton.jit
def _fused_add_rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, hidden, eps, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64) * hidden
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    total = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    total += tl.load(residual_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    store_rounded(residual_out_ptr + row + cols, total, mask)
    # The norm reads the stored (rounded) sum, as the next layer's residual will.
    stored = rounded_like(total, residual_out_ptr.dtype.element_ty)
    _rms_norm_row(stored, weight_ptr, out_ptr + row, cols, mask, hidden, eps)


@KERNELS.register("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """Normalise each row of x by its root mean square, times the gain."""
    tokens, hidden = x.shape
    if tokens:
        _rms_norm_kernel[(tokens,)](x, weight, out, hidden, eps, BLOCK=triton.next_power_of_2(hidden))


@KERNELS.register("fused_add_rms_norm")
def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor,
) -> None:
    """Add the residual, store the sum, and RMS-normalise it, in one pass per row."""
    tokens, hidden = x.shape
    if tokens:
        _fused_add_rms_norm_kernel[(tokens,)](
            x, residual, weight, out, residual_out, hidden, eps, BLOCK=triton.next_power_of_2(hidden)
        )
