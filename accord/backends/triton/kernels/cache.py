"""KV cache writers: reshape_and_cache (GQA key and value caches) and
concat_and_cache_mla (MLA's latent cache). One kernel copies a token's row into its
slot; the MLA writer launches it twice, for the latent and the rope columns."""

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
