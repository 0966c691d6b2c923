"""reshape_and_cache on npu_scatter_pa_kv_cache (ND mode), and concat_and_cache_mla and
kv_convert on npu_scatter_nd_update_. Neither operator takes a -1 padding slot (slots must lie in
[0, NB*BS)), so padding rows are dropped at the boundary before the call. An fp8 cache
is written as the contract says (value / scale, saturated) in the cache's format:
e4m3fn only, as Ascend has no e4m3fnuz."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from ....op_contracts import FLOAT_DTYPES, FP8_MAX, KernelSet

#: Cache formats the writers take: the float dtypes, and OCP fp8 (the only fp8 Ascend has).
CACHE_DTYPES = (*FLOAT_DTYPES, torch.float8_e4m3fn)


def _stored(rows: torch.Tensor, scale: float, cache_dtype: torch.dtype) -> torch.Tensor:
    """`rows` in the cache's format: as they are, or divided by the scale and
    saturated into fp8 (the contract's fp8 cache rule)."""
    if cache_dtype != torch.float8_e4m3fn:  # the contract's rule: the cache has rows' dtype
        return rows
    limit = FP8_MAX[cache_dtype]
    return (rows.float() / scale).clamp(-limit, limit).to(cache_dtype)


def _kept(slot_mapping: torch.Tensor) -> torch.Tensor:
    """Positions of the tokens with a real slot (padding is -1)."""
    return (slot_mapping >= 0).nonzero().squeeze(1)


def reshape_and_cache(
    npu: Any,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float,
    v_scale: float,
) -> None:
    """npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slots, cache_mode='Norm')
    on the tokens that have a slot; the contract's [NB, BS, Hk, D] caches are the
    operator's ND layout as they are."""
    kept = _kept(slot_mapping)
    if kept.numel() == 0:
        return
    keys = _stored(key.index_select(0, kept), k_scale, key_cache.dtype).contiguous()
    values = _stored(value.index_select(0, kept), v_scale, value_cache.dtype).contiguous()
    npu.npu_scatter_pa_kv_cache(keys, values, key_cache, value_cache, slot_mapping.index_select(0, kept), cache_mode="Norm")


def concat_and_cache_mla(
    npu: Any, kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, scale: float
) -> None:
    """npu_scatter_nd_update_ of concat(kv_c, k_pe) rows into the cache seen as
    [NB*BS, L+R] rows. The operator has no fp8 dtype on A2/A3, so an fp8 cache and its
    rows are handed over as their int8 bytes (a bit-exact view, not a conversion)."""
    kept = _kept(slot_mapping)
    if kept.numel() == 0:
        return
    rows = _stored(torch.cat([kv_c, k_pe], dim=-1).index_select(0, kept), scale, kv_cache.dtype)
    flat = kv_cache.view(-1, kv_cache.shape[-1])
    if kv_cache.dtype == torch.float8_e4m3fn:
        flat, rows = flat.view(torch.int8), rows.view(torch.int8)
    npu.npu_scatter_nd_update_(flat, slot_mapping.index_select(0, kept)[:, None], rows.contiguous())


def kv_convert(
    npu: Any,
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    src_scale: float,
    dst_scale: float,
) -> None:
    """The rows gathered from their source slots and converted on the device (fp32,
    the source's scale, then the contract's fp8 rule), then npu_scatter_nd_update_ into
    the destination seen as [NB*BS, W] rows; fp8 rows travel as their int8 bytes."""
    kept = _kept(dst_slots)
    if kept.numel() == 0:
        return
    width = src_cache.shape[-1]
    flat_src = src_cache.view(-1, width)
    sources = src_slots.index_select(0, kept).long()
    if src_cache.dtype == torch.float8_e4m3fn:
        rows = flat_src.view(torch.int8).index_select(0, sources).view(src_cache.dtype).float() * src_scale
    else:
        rows = flat_src.index_select(0, sources).float()
    rows = _stored(rows, dst_scale, dst_cache.dtype)
    flat = dst_cache.view(-1, width)
    if dst_cache.dtype == torch.float8_e4m3fn:
        flat, rows = flat.view(torch.int8), rows.view(torch.int8)
    else:
        rows = rows.to(dst_cache.dtype)
    npu.npu_scatter_nd_update_(flat, dst_slots.index_select(0, kept)[:, None], rows.contiguous())


def register(kernels: KernelSet, npu: Any) -> None:
    """Add the cache writers and kv_convert; fp8 caches are e4m3fn only."""
    claims = {"key_cache": CACHE_DTYPES, "value_cache": CACHE_DTYPES}
    kernels.register("reshape_and_cache", claims=claims)(partial(reshape_and_cache, npu))
    kernels.register("concat_and_cache_mla", claims={"kv_cache": CACHE_DTYPES})(partial(concat_and_cache_mla, npu))
    convert_claims = {"src_cache": CACHE_DTYPES, "dst_cache": CACHE_DTYPES}
    kernels.register("kv_convert", claims=convert_claims)(partial(kv_convert, npu))
