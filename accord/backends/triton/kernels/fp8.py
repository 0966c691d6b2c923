"""FP8 quantisation (per tensor, per token, per 128-wide group) and the scaled matmul
(per-tensor, per-row and 128x128 block scales), for both e4m3 flavours.

Scales are computed in fp32 as the contract writes them; the fp8 values are rounded to
the fp8 grid in fp32 before the store (see _numerics), so the stored codes are the ones
torch's cast gives, on GPUs and under the interpreter alike.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ....op_contracts import FP8_MAX
from ._numerics import block_size, store_rounded
from ._registry import KERNELS

#: Smallest scale denominator: an all-zero granule still gets a finite scale.
MIN_AMAX = 1e-10
#: DeepSeek's block scales: 1x128 groups of activations, 128x128 tiles of weights.
BLOCK = 128
#: Columns one quantize program loads at a time while walking its granule.
_QUANT_CHUNK = 128


@triton.jit
def _quantize_kernel(
    x_ptr, q_ptr, scales_ptr, hidden, group_width, groups_per_row, fp8_max, min_amax,
    DYNAMIC: tl.constexpr, BLOCK: tl.constexpr,
):
    # One program per granule: a row (per token) or a 128-wide group of a row. A
    # static or per-tensor scale is read from scales[0, 0], already filled.
    row, group = tl.program_id(0).to(tl.int64), tl.program_id(1)
    first = group * group_width
    end = tl.minimum(first + group_width, hidden)
    if DYNAMIC:
        amax = tl.zeros((BLOCK,), tl.float32)
        for offset in range(first, end, BLOCK):
            cols = offset + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * hidden + cols, mask=cols < end, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        # div_rn: IEEE division, so scales and codes equal torch's bit for bit on GPUs too.
        scale = tl.div_rn(tl.maximum(tl.max(amax, axis=0), min_amax), fp8_max)
        tl.store(scales_ptr + row * groups_per_row + group, scale)
    else:
        scale = tl.load(scales_ptr)
    for offset in range(first, end, BLOCK):
        cols = offset + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * hidden + cols, mask=cols < end, other=0.0).to(tl.float32)
        store_rounded(q_ptr + row * hidden + cols, tl.div_rn(x, scale), cols < end)


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
    """Quantise x to fp8 with dynamic (or a static per-tensor) fp32 scales."""
    tokens, hidden = x.shape
    limit = FP8_MAX[fp8_dtype]
    if scale is not None:
        scales.copy_(scale)
    elif mode == "per_tensor":
        # The tensor-wide amax is one reduction torch does well; the rest is per row.
        amax = x.abs().amax().float() if x.numel() else torch.zeros((), device=x.device)
        scales.copy_(amax.clamp_min(MIN_AMAX) / limit)
    if tokens == 0 or hidden == 0:
        return
    group_width = group_size if mode == "per_group" else hidden
    groups = triton.cdiv(hidden, group_width)
    _quantize_kernel[(tokens, groups)](
        x, q, scales, hidden, group_width, groups, limit, MIN_AMAX,
        DYNAMIC=scale is None and mode != "per_tensor",
        BLOCK=min(_QUANT_CHUNK, triton.next_power_of_2(group_width)),
    )


@triton.jit
def _scaled_mm_kernel(
    a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, bias_ptr, out_ptr, m_size, n_size, k_size, k_blocks,
    SCALE_MODE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # SCALE_MODE: 0 per tensor, 1 per row, 2 block. BLOCK_K is 128 so that one K tile
    # is one scale group in block mode.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < m_size, cols < n_size
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k_block in range(0, k_blocks):
        ks = k_block * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = ks < k_size
        a = tl.load(a_ptr + rows[:, None] * k_size + ks[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptr + cols[None, :] * k_size + ks[:, None], mask=k_mask[:, None] & col_mask[None, :], other=0.0)
        partial = tl.dot(a, b)
        if SCALE_MODE == 2:
            a_scale = tl.load(a_scale_ptr + rows * k_blocks + k_block, mask=row_mask, other=0.0)
            b_scale = tl.load(b_scale_ptr + (cols // BLOCK_K) * k_blocks + k_block, mask=col_mask, other=0.0)
            acc += partial * a_scale[:, None] * b_scale[None, :]
        else:
            acc += partial
    if SCALE_MODE == 0:
        acc = acc * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr))
    elif SCALE_MODE == 1:
        a_scale = tl.load(a_scale_ptr + rows, mask=row_mask, other=0.0)
        b_scale = tl.load(b_scale_ptr + cols, mask=col_mask, other=0.0)
        acc = acc * a_scale[:, None] * b_scale[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    store_rounded(out_ptr + rows[:, None] * n_size + cols[None, :], acc, row_mask[:, None] & col_mask[None, :])


_SCALE_MODES = {"tensor": 0, "row": 1, "block": 2}


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
    """out = (a * a_scale) @ (b * b_scale)^T (+ bias): fp8 dots, fp32 accumulation."""
    m_size, k_size = a.shape
    n_size = b.shape[0]
    if m_size == 0 or n_size == 0:
        return
    block_m, block_n = block_size(min(m_size, 64)), block_size(min(n_size, 64))
    _scaled_mm_kernel[(triton.cdiv(m_size, block_m), triton.cdiv(n_size, block_n))](
        a, b, a_scale, b_scale, bias if bias is not None else out, out,
        m_size, n_size, k_size, triton.cdiv(k_size, BLOCK),
        SCALE_MODE=_SCALE_MODES[scale_mode], HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK,
    )
