"""KV cache writers: reshape_and_cache (GQA key and value caches) and
concat_and_cache_mla (MLA's latent cache). One kernel copies a token's row into its
slot; the MLA writer launches it twice, for the latent and the rope columns. kv_convert
copies a token's row between two caches of different specs, converting in fp32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ....op_contracts import FP8_DTYPES
from ._numerics import store_rounded
from ._registry import KERNELS


@triton.jit
def _write_slot_kernel(
    source_ptr, cache_ptr, slot_mapping_ptr, width, cache_row_width, column, scale, BLOCK: tl.constexpr
):
    token = tl.program_id(0).to(tl.int64)
    # The slot is read at slot_mapping's own width, then widened for the address.
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:  # a negative slot is padding
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < width
        row = tl.load(source_ptr + token * width + cols, mask=mask).to(tl.float32)
        # div_rn: IEEE division (GPUs' default fp32 divide is approximate).
        store_rounded(cache_ptr + slot * cache_row_width + column + cols, tl.div_rn(row, scale), mask)


def _write_slots(
    source: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor, scale: float, column: int = 0
) -> None:
    """Copy each token's row of `source` (flattened) into its cache slot at `column`;
    an fp8 cache stores row / scale (saturated), any other cache the row itself."""
    tokens = source.shape[0]
    width = source[0].numel() if tokens else 0
    if not tokens or not width:
        return
    block = min(1024, triton.next_power_of_2(width))
    cache_row_width = cache[0, 0].numel()
    divisor = scale if cache.dtype in FP8_DTYPES else 1.0
    _write_slot_kernel[(tokens, triton.cdiv(width, block))](
        source, cache, slot_mapping, width, cache_row_width, column, divisor, BLOCK=block
    )


@KERNELS.register("reshape_and_cache")
def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float,
    v_scale: float,
) -> None:
    """Store each token's keys and values at its slot of the paged caches."""
    _write_slots(key, key_cache, slot_mapping, k_scale)
    _write_slots(value, value_cache, slot_mapping, v_scale)


@KERNELS.register("concat_and_cache_mla")
def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float,
) -> None:
    """Store concat(kv_c, k_pe) of each token at its slot of the latent cache."""
    _write_slots(kv_c, kv_cache, slot_mapping, scale)
    _write_slots(k_pe, kv_cache, slot_mapping, scale, column=kv_c.shape[1])


@triton.jit
def _convert_slot_kernel(
    src_ptr, dst_ptr, src_slots_ptr, dst_slots_ptr, width, src_scale, dst_scale,
    SRC_FP8: tl.constexpr, DST_FP8: tl.constexpr, BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    destination = tl.load(dst_slots_ptr + token).to(tl.int64)
    if destination >= 0:  # a negative slot is padding
        source = tl.load(src_slots_ptr + token).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < width
        row = tl.load(src_ptr + source * width + cols, mask=mask).to(tl.float32)
        if SRC_FP8:
            row = row * src_scale
        if DST_FP8:
            row = tl.div_rn(row, dst_scale)  # IEEE division, as the contract says
        store_rounded(dst_ptr + destination * width + cols, row, mask)


@KERNELS.register("kv_convert")
def kv_convert(
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    src_scale: float,
    dst_scale: float,
) -> None:
    """Copy each token's row from its source slot to its destination slot, converted
    in fp32 and rounded once to the destination's dtype (saturated into fp8)."""
    tokens, width = dst_slots.shape[0], src_cache.shape[-1]
    if not tokens or not width:
        return
    block = min(1024, triton.next_power_of_2(width))
    _convert_slot_kernel[(tokens, triton.cdiv(width, block))](
        src_cache, dst_cache, src_slots, dst_slots, width, src_scale, dst_scale,
        SRC_FP8=src_cache.dtype in FP8_DTYPES, DST_FP8=dst_cache.dtype in FP8_DTYPES, BLOCK=block,
    )
