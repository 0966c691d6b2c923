"""Reference KV cache writers: reshape_and_cache (GQA key and value caches) and
concat_and_cache_mla (MLA's latent cache), and kv_convert between two caches' specs."""

from __future__ import annotations

import torch

from ....op_contracts import FP8_DTYPES
from . import _fp8
from ._registry import KERNELS


def _write_slots(cache: torch.Tensor, slot_mapping: torch.Tensor, rows: torch.Tensor, scale: float) -> None:
    """Store `rows[t]` at flat slot `slot_mapping[t]` of `cache`, skipping negative slots."""
    slots = slot_mapping.long()
    valid = slots >= 0
    flat = cache.view(-1, *cache.shape[2:])  # [NB * BS, ...]: slot s is row s
    flat[slots[valid]] = _fp8.store(rows[valid], scale, cache.dtype)


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
    _write_slots(key_cache, slot_mapping, key, k_scale)
    _write_slots(value_cache, slot_mapping, value, v_scale)


@KERNELS.register("concat_and_cache_mla")
def concat_and_cache_mla(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    scale: float,
) -> None:
    _write_slots(kv_cache, slot_mapping, torch.cat([kv_c, k_pe], dim=-1), scale)


@KERNELS.register("kv_convert")
def kv_convert(
    src_cache: torch.Tensor,
    dst_cache: torch.Tensor,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    src_scale: float,
    dst_scale: float,
) -> None:
    valid = dst_slots.long() >= 0
    rows = src_cache.view(-1, src_cache.shape[-1])[src_slots.long()[valid]].float()
    if src_cache.dtype in FP8_DTYPES:
        rows = rows * torch.tensor(src_scale, dtype=torch.float32)
    _write_slots(dst_cache, dst_slots[valid], rows, dst_scale)
