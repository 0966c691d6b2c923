"""Paged attention (GQA, varlen prefill and decode in one launch) and MLA attention over
the latent cache: flash-attention style online softmax over block-table pages.

One program owns a tile of BLOCK_M (query row, query head) lanes: the heads that share
one KV head (GQA's group; all heads for MLA) times as many query rows of one sequence as
fit, so a decode step still fills the tile. It walks the sequence's cached positions
BLOCK_N at a time through its block table. Every index is read at its own tensor's
width and widened to int64 before it becomes an address.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ....op_contracts import FP8_DTYPES
from ._numerics import block_size, dot, dot_in_fp32, store_rounded
from ._registry import KERNELS

BLOCK_N = 64


@dataclass(frozen=True)
class LaneTiling:
    """How (query row, head) lanes tile the launch: `heads_per_tile` heads of one KV
    head's group times `rows_per_tile` query rows make one tile of `block_m` lanes."""

    block_m: int
    heads_per_tile: int
    rows_per_tile: int
    head_chunks: int

    @classmethod
    def for_group(cls, group: int, max_block_m: int) -> "LaneTiling":
        """The tiling for `group` query heads per KV head, tiles of at most max_block_m."""
        block_m = min(max_block_m, block_size(group))
        heads = min(group, block_m)
        return cls(block_m, heads, block_m // heads, triton.cdiv(group, heads))


@triton.jit
def _query_lanes(query_start_loc_ptr, seq_lens_ptr, batch, group, heads_per_tile, rows_per_tile,
                 BLOCK_M: tl.constexpr):
    """(first query row of the sequence, its cached length, each lane's query row and
    query head within the group's chunk, lane mask, absolute position of each lane's
    row) for this program's tile."""
    start = tl.load(query_start_loc_ptr + batch).to(tl.int64)
    q_len = tl.load(query_start_loc_ptr + batch + 1).to(tl.int64) - start
    seq_len = tl.load(seq_lens_ptr + batch).to(tl.int64)
    lanes = tl.arange(0, BLOCK_M)
    rows = tl.program_id(2) * rows_per_tile + lanes // heads_per_tile
    head_in_group = (tl.program_id(1) % tl.cdiv(group, heads_per_tile)) * heads_per_tile + lanes % heads_per_tile
    mask = (lanes < rows_per_tile * heads_per_tile) & (rows < q_len) & (head_in_group < group)
    return start, seq_len, rows, head_in_group, mask, seq_len - q_len + rows


@triton.jit
def _cache_slots(block_table_ptr, positions, mask, BLOCK_SIZE_KV):
    """Flat cache slot of each cached position, through the sequence's block table."""
    block = tl.load(block_table_ptr + positions // BLOCK_SIZE_KV, mask=mask, other=0).to(tl.int64)
    return block * BLOCK_SIZE_KV + positions % BLOCK_SIZE_KV


@triton.jit
def _softmax_step(scores, visible, row_max, row_sum):
    """One online-softmax step: the probabilities of this tile, the factor rescaling
    earlier partial sums, and the updated running max and sum. Lanes that have seen
    nothing yet keep max -inf and sum 0 without producing NaNs."""
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    probs = tl.exp(scores - safe_max[:, None])
    rescale = tl.exp(row_max - safe_max)
    return probs, rescale, new_max, row_sum * rescale + tl.sum(probs, axis=1)


@triton.jit
def _load_kv(ptr, mask, scale, DTYPE: tl.constexpr, IS_FP8: tl.constexpr):
    """A cache tile in the query's dtype: fp8 pages are dequantised (times scale)."""
    tile = tl.load(ptr, mask=mask, other=0.0)
    if IS_FP8:
        tile = (tile.to(tl.float32) * scale).to(DTYPE)
    return tile


@triton.jit
def _paged_attention_kernel(
    query_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    scale, sliding_window, k_scale, v_scale,
    q_heads, kv_heads, head_dim, block_size_kv, block_table_stride, heads_per_tile, rows_per_tile,
    IS_FP8: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    batch = tl.program_id(0)
    group = q_heads // kv_heads
    kv_head = tl.program_id(1) // tl.cdiv(group, heads_per_tile)
    start, seq_len, rows, head_in_group, lane_mask, q_pos = _query_lanes(
        query_start_loc_ptr, seq_lens_ptr, batch, group, heads_per_tile, rows_per_tile, BLOCK_M
    )
    if tl.max(lane_mask.to(tl.int32), axis=0) > 0:
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < head_dim
        q_offsets = ((start + rows) * q_heads + kv_head * group + head_in_group)[:, None] * head_dim + dims[None, :]
        q_mask = lane_mask[:, None] & dim_mask[None, :]
        q = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0)
        table = block_tables_ptr + batch.to(tl.int64) * block_table_stride
        # Causal: no lane sees past the last row's position; the window bounds the
        # first visible position of the first row.
        kv_end = tl.minimum(seq_len, tl.max(tl.where(lane_mask, q_pos, 0)) + 1)
        first_q_pos = tl.min(tl.where(lane_mask, q_pos, seq_len))
        kv_begin = tl.where(sliding_window > 0, tl.maximum(first_q_pos - sliding_window + 1, 0), 0)
        kv_begin = (kv_begin // BLOCK_N) * BLOCK_N
        row_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        row_sum = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        for first in range(kv_begin, kv_end, BLOCK_N):
            positions = first + tl.arange(0, BLOCK_N)
            in_range = positions < kv_end
            slots = _cache_slots(table, positions, in_range, block_size_kv)
            kv_offsets = (slots * kv_heads + kv_head)[:, None] * head_dim + dims[None, :]
            kv_mask = in_range[:, None] & dim_mask[None, :]
            keys = _load_kv(key_cache_ptr + kv_offsets, kv_mask, k_scale, q.dtype, IS_FP8)
            scores = dot(q, tl.trans(keys), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), DOT_FP32) * scale
            distance = q_pos[:, None] - positions[None, :]
            visible = in_range[None, :] & (distance >= 0) & ((sliding_window <= 0) | (distance < sliding_window))
            probs, rescale, row_max, row_sum = _softmax_step(scores, visible, row_max, row_sum)
            values = _load_kv(value_cache_ptr + kv_offsets, kv_mask, v_scale, q.dtype, IS_FP8)
            acc = dot(probs.to(values.dtype), values, acc * rescale[:, None], DOT_FP32)
        out = acc / tl.where(row_sum == 0.0, 1.0, row_sum)[:, None]
        store_rounded(out_ptr + q_offsets, out, q_mask)


@triton.jit
def _mla_attention_kernel(
    q_latent_ptr, q_pe_ptr, kv_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    scale, kv_scale, heads, latent_dim, rope_dim, block_size_kv, block_table_stride, heads_per_tile, rows_per_tile,
    IS_FP8: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
):
    batch = tl.program_id(0)
    start, seq_len, rows, head, lane_mask, q_pos = _query_lanes(
        query_start_loc_ptr, seq_lens_ptr, batch, heads, heads_per_tile, rows_per_tile, BLOCK_M
    )
    if tl.max(lane_mask.to(tl.int32), axis=0) > 0:
        latent, rope = tl.arange(0, BLOCK_L), tl.arange(0, BLOCK_R)
        latent_mask, rope_mask = latent < latent_dim, rope < rope_dim
        token_head = (start + rows) * heads + head
        out_offsets = token_head[:, None] * latent_dim + latent[None, :]
        q_mask = lane_mask[:, None] & latent_mask[None, :]
        q_lat = tl.load(q_latent_ptr + out_offsets, mask=q_mask, other=0.0)
        q_pe = tl.load(
            q_pe_ptr + token_head[:, None] * rope_dim + rope[None, :],
            mask=lane_mask[:, None] & rope_mask[None, :],
            other=0.0,
        )
        table = block_tables_ptr + batch.to(tl.int64) * block_table_stride
        kv_end = tl.minimum(seq_len, tl.max(tl.where(lane_mask, q_pos, 0)) + 1)
        row_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        row_sum = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_L), tl.float32)
        for first in range(0, kv_end, BLOCK_N):
            positions = first + tl.arange(0, BLOCK_N)
            in_range = positions < kv_end
            rows_of_cache = _cache_slots(table, positions, in_range, block_size_kv)[:, None] * (latent_dim + rope_dim)
            cached_latent = _load_kv(
                kv_cache_ptr + rows_of_cache + latent[None, :],
                in_range[:, None] & latent_mask[None, :], kv_scale, q_lat.dtype, IS_FP8,
            )
            cached_rope = _load_kv(
                kv_cache_ptr + rows_of_cache + latent_dim + rope[None, :],
                in_range[:, None] & rope_mask[None, :], kv_scale, q_lat.dtype, IS_FP8,
            )
            scores = dot(q_lat, tl.trans(cached_latent), tl.zeros((BLOCK_M, BLOCK_N), tl.float32), DOT_FP32)
            scores = dot(q_pe, tl.trans(cached_rope), scores, DOT_FP32) * scale
            visible = in_range[None, :] & (positions[None, :] <= q_pos[:, None])
            probs, rescale, row_max, row_sum = _softmax_step(scores, visible, row_max, row_sum)
            acc = dot(probs.to(cached_latent.dtype), cached_latent, acc * rescale[:, None], DOT_FP32)
        out = acc / tl.where(row_sum == 0.0, 1.0, row_sum)[:, None]
        store_rounded(out_ptr + out_offsets, out, q_mask)


def _launch_shape(query_start_loc: torch.Tensor, out: torch.Tensor) -> tuple[int, int]:
    """(batch size, longest query length) of the varlen batch. Zeroes the padding rows
    past the last sequence's, which no program owns. One host sync: the grid needs it."""
    starts = query_start_loc.long()
    batch = starts.numel() - 1
    if batch <= 0:
        out.zero_()
        return 0, 0
    total, longest = torch.stack([starts[-1], (starts[1:] - starts[:-1]).max()]).tolist()
    out[total:].zero_()
    return batch, longest


@KERNELS.register("paged_attention")
def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int,
    k_scale: float,
    v_scale: float,
    out: torch.Tensor,
) -> None:
    """Causal (optionally sliding-window) GQA attention of every sequence's new rows."""
    batch, longest = _launch_shape(query_start_loc, out)
    if batch == 0 or longest <= 0:
        return
    _, q_heads, head_dim = query.shape
    _, block_size_kv, kv_heads, _ = key_cache.shape
    tiling = LaneTiling.for_group(q_heads // kv_heads, max_block_m=64)
    grid = (batch, kv_heads * tiling.head_chunks, triton.cdiv(longest, tiling.rows_per_tile))
    _paged_attention_kernel[grid](
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, out,
        scale, sliding_window, k_scale, v_scale,
        q_heads, kv_heads, head_dim, block_size_kv, block_tables.stride(0),
        tiling.heads_per_tile, tiling.rows_per_tile,
        IS_FP8=key_cache.dtype in FP8_DTYPES, DOT_FP32=dot_in_fp32(query.dtype),
        BLOCK_M=tiling.block_m, BLOCK_N=BLOCK_N, BLOCK_D=block_size(head_dim),
    )


@KERNELS.register("mla_attention")
def mla_attention(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    kv_scale: float,
    out: torch.Tensor,
) -> None:
    """Causal attention of latent queries over the latent cache (weights absorbed)."""
    batch, longest = _launch_shape(query_start_loc, out)
    if batch == 0 or longest <= 0:
        return
    _, heads, latent_dim = q_latent.shape
    rope_dim = q_pe.shape[2]
    # Every head reads the one latent cache; the tile is kept small because its
    # accumulator is latent-wide (512 columns in DeepSeek-V3).
    tiling = LaneTiling.for_group(heads, max_block_m=16)
    _mla_attention_kernel[(batch, tiling.head_chunks, triton.cdiv(longest, tiling.rows_per_tile))](
        q_latent, q_pe, kv_cache, block_tables, seq_lens, query_start_loc, out,
        scale, kv_scale, heads, latent_dim, rope_dim, kv_cache.shape[1], block_tables.stride(0),
        tiling.heads_per_tile, tiling.rows_per_tile,
        IS_FP8=kv_cache.dtype in FP8_DTYPES, DOT_FP32=dot_in_fp32(q_latent.dtype),
        BLOCK_M=tiling.block_m, BLOCK_N=BLOCK_N, BLOCK_L=block_size(latent_dim), BLOCK_R=block_size(rope_dim),
    )
