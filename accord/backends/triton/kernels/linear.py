"""Dense GEMM, y = x @ W^T (+ bias): one program per (row tile, column tile), fp32
accumulator, rounded once on store.

On GPUs the tile shape is autotuned per (N, K, row-count class) and cached per device
(see _autotune); under the interpreter one small tile is used.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._autotune import row_class, tuned
from ._numerics import dot, dot_in_fp32, store_rounded
from ._registry import KERNELS

#: Decode (few rows) wants narrow row tiles and wide K; prefill wants square tiles.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
    for m, n, k, w, s in (
        (16, 64, 128, 4, 4),
        (16, 128, 128, 4, 4),
        (32, 64, 64, 4, 4),
        (64, 128, 64, 4, 3),
        (128, 128, 32, 8, 3),
        (128, 256, 64, 8, 3),
    )
]


@tuned(_GPU_CONFIGS, triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}, num_warps=4), ["N", "K", "ROW_CLASS"])
@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_xk, ROW_CLASS,
    HAS_BIAS: tl.constexpr, IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask, col_mask = rows < M, cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + ks) < K
        a = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + (k0 + ks)[None, :] * stride_xk,
            mask=row_mask[:, None] & k_mask[None, :], other=0.0,
        )
        # W is [N, K] row-major: the [BLOCK_K, BLOCK_N] tile of W^T.
        b = tl.load(
            w_ptr + cols[None, :].to(tl.int64) * K + (k0 + ks)[:, None],
            mask=col_mask[None, :] & k_mask[:, None], other=0.0,
        )
        acc = dot(a, b, acc, IN_FP32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    store_rounded(out_ptr + offsets, acc, row_mask[:, None] & col_mask[None, :])


@KERNELS.register("linear")
def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype | None, out: torch.Tensor
) -> None:
    """out = x @ weight^T (+ bias), fp32 accumulation, rounded once to out's dtype (x's, or
    fp32 where out_dtype asks: the store then keeps the accumulator as it is)."""
    rows, depth = x.shape
    width = weight.shape[0]
    if rows == 0 or width == 0:
        return
    if depth == 0:
        out.copy_(bias.expand_as(out) if bias is not None else torch.zeros_like(out))
        return

    def grid(meta: dict) -> tuple[int, int]:
        return triton.cdiv(rows, meta["BLOCK_M"]), triton.cdiv(width, meta["BLOCK_N"])

    _linear_kernel[grid](
        x, weight, bias if bias is not None else out, out, rows, width, depth, x.stride(0), x.stride(1),
        row_class(rows), HAS_BIAS=bias is not None, IN_FP32=dot_in_fp32(x.dtype),
    )
