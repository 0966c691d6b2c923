"""KV cache writers: reshape_and_cache (GQA key and value caches) and
concat_and_cache_mla (MLA's latent cache): a row copy per token in C where built, else
one index_copy_ per cache; and kv_convert, one gather, conversion and index_copy_ per
cache between two KV specs."""

from __future__ import annotations

import torch

from ....op_contracts import FP8_DTYPES
from . import _native_elementwise as native
from ._fp8 import as_stored
from ._registry import KERNELS


def _kept_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The slots to write as int64, and which tokens they belong to when negative slots
    (padding, skipped) are present; None keeps every token (the common step has no
    padding, so filtering costs only the check)."""
    slots = slot_mapping.long()
    if slots.numel() and slots.min().item() < 0:
        keep = slots >= 0
        return slots[keep], keep
    return slots, None


def _write_slots(
    cache: torch.Tensor, slots: torch.Tensor, keep: torch.Tensor | None, rows: torch.Tensor, scale: float
) -> None:
    """Store the kept `rows` at their flat slots `slots` of `cache`."""
    if keep is not None:
        rows = rows[keep]
    flat = cache.view(-1, *cache.shape[2:])  # [NB * BS, ...]: slot s is row s
    stored = as_stored(rows, scale, cache.dtype)
    # index_copy_ has no fp8 kernel on CPU; the bytes are the same as uint8.
    if cache.dtype in FP8_DTYPES:
        flat, stored = flat.view(torch.uint8), stored.view(torch.uint8)
    flat.index_copy_(0, slots, stored)


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
    """Write this step's keys and values into their cache slots: one call into
    elementwise.c for a cache of the inputs' dtype, index_copy_ otherwise."""
    if native.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
        return
    slots, keep = _kept_slots(slot_mapping)
    _write_slots(key_cache, slots, keep, key, k_scale)
    _write_slots(value_cache, slots, keep, value, v_scale)


@KERNELS.register("concat_and_cache_mla")
def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float,
) -> None:
    """Write concat(kv_c, k_pe) of each token into its latent cache slot."""
    _write_slots(kv_cache, *_kept_slots(slot_mapping), torch.cat([kv_c, k_pe], dim=-1), scale)


def _source_rows(src_cache: torch.Tensor, sources: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """The rows of `src_cache` at flat slots `sources`, ready for a cache of `dtype`:
    as they are for the same float dtype, else in fp32 (times `scale` from fp8)."""
    flat = src_cache.view(-1, src_cache.shape[-1])
    if src_cache.dtype not in FP8_DTYPES:
        rows = flat.index_select(0, sources)
        return rows if rows.dtype == dtype else rows.float()
    # index_select has no fp8 kernel on CPU; the bytes are the same as uint8.
    rows = flat.view(torch.uint8).index_select(0, sources).view(src_cache.dtype).float()
    return rows.mul_(torch.tensor(scale, dtype=torch.float32))


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
    to the destination's dtype (and fp8 scale) in fp32 and rounded once."""
    slots, keep = _kept_slots(dst_slots)
    sources = src_slots.long() if keep is None else src_slots.long()[keep]
    rows = _source_rows(src_cache, sources, src_scale, dst_cache.dtype)
    if dst_cache.dtype not in FP8_DTYPES:
        rows = rows.to(dst_cache.dtype)
    _write_slots(dst_cache, slots, None, rows, dst_scale)
