"""Reference KV cache writers: reshape_and_cache (GQA key and value caches) and
concat_and_cache_mla (MLA's latent cache)."""

from __future__ import annotations

import torch

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
