"""Fused MoE: token slots sorted by expert, two grouped GEMMs, a weighted combine.

The (token, k) slots are sorted by local expert with plain torch ops (no host sync) and
each expert's run is padded to BLOCK_M rows, so every row block of the sorted order
belongs to one expert. Kernel 1 computes silu(x W_gate^T) * (x W_up^T) per block into
an intermediate; kernel 2 multiplies by W_down^T, scales by the slot's routing weight
and scatters to a per-slot fp32 buffer; the combine sums each token's slots. Slots
routed to -1 (an expert on another rank) are never computed.

fp8 weights take one of two paths (`Fp8Path`):
- dequantised: each weight tile times its 128x128 block scale in fp32, fp32 dots and
  an fp32 intermediate, as exact as the contract's fp32 accumulation asks. The
  interpreter (CPU tests, conformance) and fp32 activations use it.
- fp8 dots (GPUs, half activations): as vLLM's block-fp8 MoE, the activations are
  quantised to fp8 per token and 128-wide group (and the SwiGLU intermediate again
  before the down GEMM), both operands go to fp8 tensor-core dots, and each K tile's
  fp32 partial product is scaled by the activation group's and the weight block's
  scales before it joins the accumulator. The quantisation costs accuracy, declared by
  the GPU backends (`GpuBackend.tolerance_override`).

Tile widths (BLOCK_N, BLOCK_K, warps, stages) are autotuned per shape class on GPUs
(see _autotune); BLOCK_M is picked from the average rows per expert before the sort,
which it sizes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ....op_contracts import FP8_DTYPES
from ..interpreter import triton_interpreter_enabled
from ._autotune import row_class, tuned
from ._numerics import dot, dot_in_fp32, store_rounded
from ._registry import KERNELS
from .fp8 import quantize_fp8

#: DeepSeek's weight_scale_inv tiles: one fp32 scale per 128x128 block of a weight, and
#: the 128-wide activation groups of the fp8-dot path.
WEIGHT_BLOCK: tl.constexpr = 128
#: BLOCK_K of every configuration divides WEIGHT_BLOCK, so one K tile has one scale.
_GPU_CONFIGS = [
    triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
    for n, k, w, s in (
        (32, 128, 4, 4),
        (64, 64, 4, 4),
        (64, 128, 4, 3),
        (128, 64, 4, 3),
        (128, 128, 4, 3),
        (128, 128, 8, 4),
        (256, 128, 8, 3),
    )
]
_INTERPRETER_CONFIG = triton.Config({"BLOCK_N": 64, "BLOCK_K": 64}, num_warps=4)
#: The tile configuration is tuned per model shape, row-block height and slot-count class.
_TUNING_KEY = ["hidden_size", "intermediate", "BLOCK_M", "ROW_CLASS"]


class Fp8Path(enum.IntEnum):
    """How a kernel multiplies by its weights (see the module docstring)."""

    UNQUANTISED = 0
    DEQUANTISED = 1
    FP8_DOTS = 2


def block_m_for(slots: int, num_experts: int, interpreter: bool) -> int:
    """Row-block height: 16 while experts see a few rows each (decode), growing to 64 as
    their average share grows (prefill); 16 under the interpreter."""
    if interpreter:
        return 16
    return min(64, max(16, triton.next_power_of_2(max(slots // max(num_experts, 1), 1))))


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
                 DTYPE: tl.constexpr, FP8: tl.constexpr):
    """The [cols, rows] transposed tile of expert's [row_count, col_count] weight: as
    stored for unquantised weights and fp8 dots, dequantised by its 128x128 block
    scales (in DTYPE) on the dequantised path."""
    mask = (rows[None, :] < row_count) & (cols[:, None] < col_count)
    offsets = (expert * row_count + rows[None, :]) * col_count + cols[:, None]
    tile = tl.load(w_ptr + offsets, mask=mask, other=0.0)
    if FP8 == 1:
        block = (expert * row_blocks + rows[None, :] // WEIGHT_BLOCK) * col_blocks + cols[:, None] // WEIGHT_BLOCK
        tile = (tile.to(tl.float32) * tl.load(scale_ptr + block, mask=mask, other=0.0)).to(DTYPE)
    return tile


@triton.jit
def _accumulate(acc, x, x_scale, w, w_scale_ptr, expert, rows, first, row_count, row_blocks, col_blocks,
                FP8: tl.constexpr, DOT_FP32: tl.constexpr):
    """acc + x @ w for one K tile starting at `first`; on the fp8-dot path the fp32
    product is scaled by the activation group's scales (`x_scale`, one per row of x)
    and the weight's block scale of each output column `rows`."""
    if FP8 == 2:
        scale_block = (expert * row_blocks + rows // WEIGHT_BLOCK) * col_blocks + first // WEIGHT_BLOCK
        w_scale = tl.load(w_scale_ptr + scale_block, mask=rows < row_count, other=0.0)
        product = dot(x, w, tl.zeros(acc.shape, tl.float32), DOT_FP32)
        return acc + product * x_scale[:, None] * w_scale[None, :]
    return dot(x, w, acc, DOT_FP32)


@tuned(_GPU_CONFIGS, _INTERPRETER_CONFIG, _TUNING_KEY)
@triton.jit
def _gate_up_kernel(
    hidden_ptr, hidden_scale_ptr, w13_ptr, w13_scale_ptr, slots_ptr, block_experts_ptr, act_ptr,
    num_slots, top_k, hidden_size, intermediate, swiglu_limit, ROW_CLASS,
    DTYPE: tl.constexpr, FP8: tl.constexpr, DOT_FP32: tl.constexpr, CLIP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    expert = tl.load(block_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert >= 0:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        slots = tl.load(slots_ptr + rows)
        real = slots < num_slots
        tokens = tl.where(real, slots // top_k, 0)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        row_blocks, col_blocks = tl.cdiv(2 * intermediate, WEIGHT_BLOCK), tl.cdiv(hidden_size, WEIGHT_BLOCK)
        for first in range(0, hidden_size, BLOCK_K):
            ks = first + tl.arange(0, BLOCK_K)
            x = tl.load(hidden_ptr + tokens[:, None] * hidden_size + ks[None, :],
                        mask=real[:, None] & (ks[None, :] < hidden_size), other=0.0)
            x_scale = tl.zeros((BLOCK_M,), tl.float32)
            if FP8 == 2:
                x_scale = tl.load(hidden_scale_ptr + tokens * col_blocks + first // WEIGHT_BLOCK, mask=real, other=0.0)
            else:
                x = x.to(DTYPE)
            # Output columns past `intermediate` are computed but never stored.
            w_gate = _weight_tile(w13_ptr, w13_scale_ptr, expert, cols, ks, 2 * intermediate, hidden_size,
                                  row_blocks, col_blocks, DTYPE, FP8)
            gate = _accumulate(gate, x, x_scale, w_gate, w13_scale_ptr, expert, cols, first, 2 * intermediate,
                               row_blocks, col_blocks, FP8, DOT_FP32)
            w_up = _weight_tile(w13_ptr, w13_scale_ptr, expert, cols + intermediate, ks, 2 * intermediate,
                                hidden_size, row_blocks, col_blocks, DTYPE, FP8)
            up = _accumulate(up, x, x_scale, w_up, w13_scale_ptr, expert, cols + intermediate, first,
                             2 * intermediate, row_blocks, col_blocks, FP8, DOT_FP32)
        if CLIP:  # DeepSeek-V4's swiglu_limit
            gate = tl.minimum(gate, swiglu_limit)
            up = tl.minimum(tl.maximum(up, -swiglu_limit), swiglu_limit)
        act = gate / (1.0 + tl.exp(-gate)) * up
        store_rounded(act_ptr + rows[:, None] * intermediate + cols[None, :], act, cols[None, :] < intermediate)


@tuned(_GPU_CONFIGS, _INTERPRETER_CONFIG, _TUNING_KEY)
@triton.jit
def _down_kernel(
    act_ptr, act_scale_ptr, w2_ptr, w2_scale_ptr, slots_ptr, block_experts_ptr, topk_weights_ptr, per_slot_ptr,
    num_slots, hidden_size, intermediate, ROW_CLASS,
    DTYPE: tl.constexpr, FP8: tl.constexpr, DOT_FP32: tl.constexpr,
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
            act = tl.load(act_ptr + rows[:, None] * intermediate + ks[None, :], mask=ks[None, :] < intermediate,
                          other=0.0)
            act_scale = tl.zeros((BLOCK_M,), tl.float32)
            if FP8 == 2:
                act_scale = tl.load(act_scale_ptr + rows * col_blocks + first // WEIGHT_BLOCK)
            else:
                act = act.to(DTYPE)
            w = _weight_tile(w2_ptr, w2_scale_ptr, expert, cols, ks, hidden_size, intermediate,
                             row_blocks, col_blocks, DTYPE, FP8)
            acc = _accumulate(acc, act, act_scale, w, w2_scale_ptr, expert, cols, first, hidden_size,
                              row_blocks, col_blocks, FP8, DOT_FP32)
        weight = tl.load(topk_weights_ptr + slots, mask=real, other=0.0)
        out_mask = real[:, None] & (cols[None, :] < hidden_size)
        tl.store(per_slot_ptr + slots[:, None] * hidden_size + cols[None, :], acc * weight[:, None], mask=out_mask)


_TRITON_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def fp8_path(weight_dtype: torch.dtype, hidden_dtype: torch.dtype, fp8_dots: bool | None = None) -> Fp8Path:
    """The path for these weights and activations: fp8 dots by default on GPUs for half
    activations (`fp8_dots` forces the choice, for tests of the GPU path on the
    interpreter); fp32 activations and the interpreter dequantise."""
    if weight_dtype not in FP8_DTYPES:
        return Fp8Path.UNQUANTISED
    if fp8_dots is None:
        fp8_dots = hidden_dtype != torch.float32 and not triton_interpreter_enabled()
    return Fp8Path.FP8_DOTS if fp8_dots else Fp8Path.DEQUANTISED


def _quantised(x: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, width] in fp8 with one fp32 scale per row and 128-wide group."""
    q = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    scales = torch.empty((x.shape[0], triton.cdiv(x.shape[1], WEIGHT_BLOCK)), dtype=torch.float32, device=x.device)
    quantize_fp8(x, None, "per_group", WEIGHT_BLOCK, fp8_dtype, q, scales)
    return q, scales


def run_fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    swiglu_limit: float,
    out: torch.Tensor,
    path: Fp8Path,
) -> None:
    """The fused MoE of the `fused_moe` contract along `path` (see `fp8_path`)."""
    tokens, hidden_size = hidden.shape
    num_experts, double_intermediate, _ = w13.shape
    intermediate = double_intermediate // 2
    # expert_map is indexed at topk_ids' width and read at its own.
    local_ids = topk_ids.long() if expert_map is None else expert_map.long()[topk_ids.long()]
    block_m = block_m_for(local_ids.numel(), num_experts, triton_interpreter_enabled())
    order = sort_by_expert(local_ids, num_experts, block_m)
    blocks, rows = order.block_experts.numel(), order.slots.numel()
    # Dots and the intermediate run in fp32 where the contract asks for fp32 steps
    # (dequantised fp8 weights, fp32 activations); else in the activations' dtype.
    exact = path == Fp8Path.DEQUANTISED or hidden.dtype == torch.float32
    compute = torch.float32 if exact else hidden.dtype
    dtype, dot_fp32 = _TRITON_DTYPES[compute], dot_in_fp32(compute)
    # Zeroed for the fp8-dot path, which quantises every row (rows of unused blocks too).
    act = (torch.zeros if path == Fp8Path.FP8_DOTS else torch.empty)((rows, intermediate), dtype=compute,
                                                                      device=hidden.device)
    per_slot = torch.zeros((order.num_slots, hidden_size), dtype=torch.float32, device=hidden.device)
    fp8_dots = path == Fp8Path.FP8_DOTS
    x, x_scale = _quantised(hidden, w13.dtype) if fp8_dots else (hidden, hidden)
    shape_class = dict(BLOCK_M=block_m, ROW_CLASS=row_class(order.num_slots))
    _gate_up_kernel[lambda meta: (blocks, triton.cdiv(intermediate, meta["BLOCK_N"]))](
        x, x_scale, w13, w13_scale if path else w13, order.slots, order.block_experts, act,
        order.num_slots, topk_ids.shape[1], hidden_size, intermediate, float(swiglu_limit),
        DTYPE=dtype, FP8=int(path), DOT_FP32=dot_fp32 or (fp8_dots and triton_interpreter_enabled()),
        CLIP=swiglu_limit > 0, **shape_class,
    )
    act, act_scale = _quantised(act, w2.dtype) if fp8_dots else (act, act)
    _down_kernel[lambda meta: (blocks, triton.cdiv(hidden_size, meta["BLOCK_N"]))](
        act, act_scale, w2, w2_scale if path else w2, order.slots, order.block_experts, topk_weights, per_slot,
        order.num_slots, hidden_size, intermediate,
        DTYPE=dtype, FP8=int(path), DOT_FP32=dot_fp32 or (fp8_dots and triton_interpreter_enabled()),
        **shape_class,
    )
    out.copy_(per_slot.view(tokens, -1, hidden_size).sum(dim=1))


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
    path = fp8_path(w13.dtype, hidden.dtype)
    run_fused_moe(hidden, w13, w2, topk_weights, topk_ids, expert_map, w13_scale, w2_scale, swiglu_limit, out, path)
