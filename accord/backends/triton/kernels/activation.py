"""The gated SiLU activation (SwiGLU): one program per (row, column block)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._numerics import store_rounded
from ._registry import KERNELS

#: Columns of the output one program handles.
_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * 2 * width + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * width + width + cols, mask=mask, other=0.0).to(tl.float32)
    store_rounded(out_ptr + row * width + cols, gate / (1.0 + tl.exp(-gate)) * up, mask)


@KERNELS.register("silu_and_mul")
def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    """out = silu(gate) * up, in fp32, rounded once."""
    tokens, width = out.shape
    block = min(_BLOCK, triton.next_power_of_2(max(width, 1)))
    if tokens and width:
        _silu_and_mul_kernel[(tokens, triton.cdiv(width, block))](x, out, width, BLOCK=block)
