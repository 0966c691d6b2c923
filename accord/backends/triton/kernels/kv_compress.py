"""DeepSeek-V4's KV compressor pooling (kv_compress): one program per (window, feature
tile) gathers the window's state rows through the block table, and for CSA the previous
window's first-half rows, and takes the per-feature softmax-weighted sum in fp32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._registry import KERNELS


@triton.jit
def _window_rows(state_ptr, table_ptr, table_row, window, rate, block_size, row_width, column,
                 slots, feats, mask):
    """[BLOCK_R, BLOCK_D] state values of a window's slots at `column + feats`."""
    positions = window * rate + slots
    block = tl.load(table_ptr + table_row + positions // block_size, mask=slots < rate, other=0).to(tl.int64)
    flat = block * block_size + positions % block_size
    return tl.load(state_ptr + flat[:, None] * row_width + column + feats[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _kv_compress_kernel(
    state_ptr, bias_ptr, table_ptr, window_seq_ptr, window_index_ptr, out_ptr,
    rate, block_size, row_width, table_width, dim, bias_width,
    OVERLAP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    # Each index tensor is read at its own width, then widened for addressing.
    seq = tl.load(window_seq_ptr + n).to(tl.int64)
    window = tl.load(window_index_ptr + n).to(tl.int64)
    slots = tl.arange(0, BLOCK_R)
    feats = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (slots[:, None] < rate) & (feats[None, :] < dim)
    table_row = seq * table_width
    features = row_width // 2  # [kv | gate]
    offset = dim if OVERLAP else 0  # CSA: this window contributes the second half
    kv = _window_rows(state_ptr, table_ptr, table_row, window, rate, block_size, row_width, offset, slots, feats, mask)
    gate = _window_rows(state_ptr, table_ptr, table_row, window, rate, block_size, row_width, features + offset,
                        slots, feats, mask)
    bias = tl.load(bias_ptr + slots[:, None] * bias_width + offset + feats[None, :], mask=mask, other=0.0)
    gate = tl.where(mask, gate + bias, float("-inf"))
    peak = tl.max(gate, axis=0)
    if OVERLAP:
        has_prev = (tl.zeros([BLOCK_R], dtype=tl.int64) + window) > 0  # window 0 has no predecessor
        prev_mask = mask & has_prev[:, None]
        prev_window = tl.maximum(window - 1, 0)
        prev_kv = _window_rows(state_ptr, table_ptr, table_row, prev_window, rate, block_size, row_width, 0,
                               slots, feats, prev_mask)
        prev_gate = _window_rows(state_ptr, table_ptr, table_row, prev_window, rate, block_size, row_width,
                                 features, slots, feats, prev_mask)
        prev_bias = tl.load(bias_ptr + slots[:, None] * bias_width + feats[None, :], mask=prev_mask, other=0.0)
        prev_gate = tl.where(prev_mask, prev_gate + prev_bias, float("-inf"))
        peak = tl.maximum(peak, tl.max(prev_gate, axis=0))
    weights = tl.exp(gate - peak[None, :])
    total = tl.sum(weights, axis=0)
    pooled = tl.sum(weights * kv, axis=0)
    if OVERLAP:
        prev_weights = tl.exp(prev_gate - peak[None, :])
        total += tl.sum(prev_weights, axis=0)
        pooled += tl.sum(prev_weights * prev_kv, axis=0)
    result = pooled / total
    tl.store(out_ptr + n * dim + feats, result.to(out_ptr.dtype.element_ty), mask=feats < dim)


@KERNELS.register("kv_compress")
def kv_compress(
    state_cache: torch.Tensor,
    position_bias: torch.Tensor,
    block_tables: torch.Tensor,
    window_seq: torch.Tensor,
    window_index: torch.Tensor,
    overlap: bool,
    out: torch.Tensor,
) -> None:
    """Pool every listed window of the paged compressor state."""
    windows, dim = out.shape
    if windows == 0:
        return
    rate, bias_width = position_bias.shape
    block_d = min(128, triton.next_power_of_2(dim))
    _kv_compress_kernel[(windows, triton.cdiv(dim, block_d))](
        state_cache, position_bias, block_tables, window_seq, window_index, out,
        rate, state_cache.shape[1], state_cache.shape[2], block_tables.shape[1], dim, bias_width,
        OVERLAP=overlap, BLOCK_R=triton.next_power_of_2(rate), BLOCK_D=block_d,
    )
