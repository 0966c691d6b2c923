"""Multi-LoRA delta (BGMV, as Punica names it): one program per token and block of
output columns reads that token's adapter slot, shrinks the token's activations by the
slot's A to the adapter's rank and expands them by its B, all in fp32, and adds the
result to the base projection's output, rounded once. Each row is computed on its own,
so a row's result never depends on the rest of its batch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._numerics import store_rounded
from ._registry import KERNELS

#: Output columns per program, and the activations' columns per step of the shrink.
BLOCK_N, BLOCK_K = 64, 64


@triton.jit
def _lora_linear_kernel(
    y_ptr, x_ptr, a_ptr, b_ptr, slot_ptr, out_ptr, x_row_stride, x_col_stride, K, R, N,
    BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    result = tl.load(y_ptr + token * N + cols, mask=col_mask, other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        ranks = tl.arange(0, BLOCK_R)
        rank_mask = ranks < R
        a_slot = a_ptr + slot * R * K
        shrunk = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            k_mask = ks < K
            x = tl.load(x_ptr + token * x_row_stride + ks * x_col_stride, mask=k_mask, other=0.0).to(tl.float32)
            a = tl.load(a_slot + ranks[:, None] * K + ks[None, :], mask=rank_mask[:, None] & k_mask[None, :], other=0.0)
            shrunk += tl.sum(a.to(tl.float32) * x[None, :], axis=1)
        b = tl.load(b_ptr + slot * R * N + ranks[:, None] * N + cols[None, :],
                    mask=rank_mask[:, None] & col_mask[None, :], other=0.0)
        result += tl.sum(shrunk[:, None] * b.to(tl.float32), axis=0)
    store_rounded(out_ptr + token * N + cols, result, col_mask)


@KERNELS.register("lora_linear")
def lora_linear(
    y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slot_ids: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """out = y + (x @ A[s]^T) @ B[s] per row (y where s = -1)."""
    tokens, n = y.shape
    _, rank, k = lora_a.shape
    if tokens:
        _lora_linear_kernel[(tokens, triton.cdiv(n, BLOCK_N))](
            y, x, lora_a, lora_b, slot_ids, out, x.stride(0), x.stride(1), k, rank, n,
            BLOCK_K=BLOCK_K, BLOCK_R=triton.next_power_of_2(max(rank, 1)), BLOCK_N=BLOCK_N,
        )
