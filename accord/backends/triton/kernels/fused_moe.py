"""Fused MoE: token slots sorted by expert, two grouped GEMMs, a weighted combine.

The (token, k) slots are sorted by local expert with plain torch ops (no host sync) and
each expert's run is padded to BLOCK_M rows, so every row block of the sorted order
belongs to one expert. Kernel 1 computes silu(x W_gate^T) * (x W_up^T) per block into
an fp32 intermediate; kernel 2 multiplies by W_down^T, scales by the slot's routing
weight and scatters to a per-slot fp32 buffer; the combine sums each token's slots.
fp8 weights are dequantised tile by tile, by their 128x128 block scales, to the
activations' dtype. Slots routed to -1 (an expert on another rank) are never computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ....op_contracts import FP8_DTYPES
from ._numerics import block_size, dot, dot_in_fp32
from ._registry import KERNELS

BLOCK_M = 16
#: Widest N and K tiles of the expert GEMMs (a K tile of 128 spans one fp8 scale block).
MAX_TILE = 128
#: DeepSeek's weight_scale_inv tiles: one fp32 scale per 128x128 block of a weight.
WEIGHT_BLOCK: tl.constexpr = 128


@dataclass(frozen=True)
class ExpertOrder:
    """The slots sorted by expert: `slots[i]` is the flat (token * K + k) slot of sorted
    row i (`num_slots` on padding rows) and `block_experts[j]` the local expert of row
    block j (-1 for blocks past the last expert's run)."""

    slots: torch.Tensor
    block_experts: torch.Tensor
    num_slots: int


def sort_by_expert(local_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertOrder:
    """Group the slots of `local_ids` [T, K] by expert, each run padded to `block_m`
    rows; ids below 0 are dropped. Sized by the worst case, so no host sync."""
    flat = local_ids.flatten().long()
    num_slots = flat.numel()
    key = torch.where(flat >= 0, flat, num_experts)  # dropped slots sort last
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=num_experts + 1)[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    sorted_key = key[order]
    kept = sorted_key < num_experts
    expert = sorted_key.clamp_max(num_experts - 1)
    rank = torch.arange(num_slots, device=flat.device) - (torch.cumsum(counts, 0) - counts)[expert]
    destination = (padded_end - padded)[expert] + rank
    capacity = triton.cdiv(num_slots + num_experts * (block_m - 1), block_m) * block_m
    slots = torch.full((capacity,), num_slots, dtype=torch.int64, device=flat.device)
    slots[destination[kept]] = order[kept]
    block_starts = torch.arange(0, capacity, block_m, device=flat.device)
    block_experts = torch.searchsorted(padded_end, block_starts, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1)
    return ExpertOrder(slots, block_experts, num_slots)


@triton.jit
def _weight_tile(w_ptr, scale_ptr, expert, rows, cols, row_count, col_count, row_blocks, col_blocks,
                 DTYPE: tl.constexpr, IS_FP8: tl.constexpr):
    """The [cols, rows] transposed tile of expert's [row_count, col_count] weight, in
    DTYPE; fp8 weights times the scale of their 128x128 block."""
    mask = (rows[None, :] < row_count) & (cols[:, None] < col_count)
    offsets = (expert * row_count + rows[None, :]) * col_count + cols[:, None]
    tile = tl.load(w_ptr + offsets, mask=mask, other=0.0)
    if IS_FP8:
        block = (expert * row_blocks + rows[None, :] // WEIGHT_BLOCK) * col_blocks + cols[:, None] // WEIGHT_BLOCK
        tile = (tile.to(tl.float32) * tl.load(scale_ptr + block, mask=mask, other=0.0)).to(DTYPE)
    return tile


@triton.jit
def _gate_up_kernel(
    hidden_ptr, w13_ptr, w13_scale_ptr, slots_ptr, block_experts_ptr, act_ptr,
    num_slots, top_k, hidden_size, intermediate, swiglu_limit,
    IS_FP8: tl.constexpr, DOT_FP32: tl.constexpr, CLIP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert >= 0:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        slots = tl.load(slots_ptr + rows)
        tokens = tl.where(slots < num_slots, slots // top_k, 0)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        row_blocks, col_blocks = tl.cdiv(2 * intermediate, WEIGHT_BLOCK), tl.cdiv(hidden_size, WEIGHT_BLOCK)
        for first in range(0, hidden_size, BLOCK_K):
            ks = first + tl.arange(0, BLOCK_K)
            x_mask = (slots[:, None] < num_slots) & (ks[None, :] < hidden_size)
            x = tl.load(hidden_ptr + tokens[:, None] * hidden_size + ks[None, :], mask=x_mask, other=0.0)
            w_gate = _weight_tile(w13_ptr, w13_scale_ptr, expert, cols, ks, 2 * intermediate, hidden_size,
                                  row_blocks, col_blocks, x.dtype, IS_FP8)
            # Output columns past `intermediate` are computed but never stored.
            w_up = _weight_tile(w13_ptr, w13_scale_ptr, expert, cols + intermediate, ks, 2 * intermediate,
                                hidden_size, row_blocks, col_blocks, x.dtype, IS_FP8)
            gate = dot(x, w_gate, gate, DOT_FP32)
            up = dot(x, w_up, up, DOT_FP32)
        if CLIP:  # DeepSeek-V4's swiglu_limit
            gate = tl.minimum(gate, swiglu_limit)
            up = tl.minimum(tl.maximum(up, -swiglu_limit), swiglu_limit)
        act = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(act_ptr + rows[:, None] * intermediate + cols[None, :], act, mask=cols[None, :] < intermediate)


@triton.jit
def _down_kernel(
    act_ptr, w2_ptr, w2_scale_ptr, slots_ptr, block_experts_ptr, topk_weights_ptr, per_slot_ptr,
    num_slots, hidden_size, intermediate,
    DTYPE: tl.constexpr, IS_FP8: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert >= 0:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        slots = tl.load(slots_ptr + rows)
        real = slots < num_slots
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        row_blocks, col_blocks = tl.cdiv(hidden_size, WEIGHT_BLOCK), tl.cdiv(intermediate, WEIGHT_BLOCK)
        for first in range(0, intermediate, BLOCK_K):
            ks = first + tl.arange(0, BLOCK_K)
            act = tl.load(act_ptr + rows[:, None] * intermediate + ks[None, :], mask=ks[None, :] < intermediate, other=0.0)
            w = _weight_tile(w2_ptr, w2_scale_ptr, expert, cols, ks, hidden_size, intermediate,
                             row_blocks, col_blocks, DTYPE, IS_FP8)
            acc = dot(act.to(DTYPE), w, acc, DOT_FP32)
        weight = tl.load(topk_weights_ptr + slots, mask=real, other=0.0)
        out_mask = real[:, None] & (cols[None, :] < hidden_size)
        tl.store(per_slot_ptr + slots[:, None] * hidden_size + cols[None, :], acc * weight[:, None], mask=out_mask)


_TRITON_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@KERNELS.register("fused_moe")
def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    activation: str,
    swiglu_limit: float,
    out: torch.Tensor,
) -> None:
    """Weighted sum of each token's chosen experts' SwiGLU MLPs."""
    tokens, hidden_size = hidden.shape
    num_experts, double_intermediate, _ = w13.shape
    intermediate = double_intermediate // 2
    # expert_map is indexed at topk_ids' width and read at its own.
    local_ids = topk_ids.long() if expert_map is None else expert_map.long()[topk_ids.long()]
    order = sort_by_expert(local_ids, num_experts, BLOCK_M)
    blocks = order.block_experts.numel()
    act = torch.empty((order.slots.numel(), intermediate), dtype=torch.float32, device=hidden.device)
    per_slot = torch.zeros((order.num_slots, hidden_size), dtype=torch.float32, device=hidden.device)
    is_fp8 = w13.dtype in FP8_DTYPES
    dtype, dot_fp32 = _TRITON_DTYPES[hidden.dtype], dot_in_fp32(hidden.dtype)
    block_n_up, block_k_up = block_size(min(intermediate, MAX_TILE)), block_size(min(hidden_size, MAX_TILE))
    _gate_up_kernel[(blocks, triton.cdiv(intermediate, block_n_up))](
        hidden, w13, w13_scale if is_fp8 else w13, order.slots, order.block_experts, act,
        order.num_slots, topk_ids.shape[1], hidden_size, intermediate, float(swiglu_limit),
        IS_FP8=is_fp8, DOT_FP32=dot_fp32, CLIP=swiglu_limit > 0, BLOCK_M=BLOCK_M, BLOCK_N=block_n_up, BLOCK_K=block_k_up,
    )
    block_n_down, block_k_down = block_size(min(hidden_size, MAX_TILE)), block_size(min(intermediate, MAX_TILE))
    _down_kernel[(blocks, triton.cdiv(hidden_size, block_n_down))](
        act, w2, w2_scale if is_fp8 else w2, order.slots, order.block_experts, topk_weights, per_slot,
        order.num_slots, hidden_size, intermediate,
        DTYPE=dtype, IS_FP8=is_fp8, DOT_FP32=dot_fp32,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n_down, BLOCK_K=block_k_down,
    )
    out.copy_(per_slot.view(tokens, -1, hidden_size).sum(dim=1))
