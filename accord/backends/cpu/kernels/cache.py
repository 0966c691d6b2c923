"""KV cache writers: reshape_and_cache (GQA key and value caches) and
concat_and_cache_mla (MLA's latent cache), one index_copy_ per cache."""

from __future__ import annotations

import torch

from ....op_contracts import FP8_DTYPES
from ._fp8 import as_stored
from ._registry import KERNELS


def _write_slots(cache: torch.Tensor, slot_mapping: torch.Tensor, rows: torch.Tensor, scale: float) -> None:
    """Store `rows[t]` at flat slot `slot_mapping[t]` of `cache`; negative slots are
    padding and skipped (filtered only when present, the common step has none)."""
    slots = slot_mapping.long()
    if slots.numel() and bool((slots < 0).any()):
        keep = slots >= 0
        slots, rows = slots[keep], rows[keep]
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
    """Write this step's keys and values into their cache slots."""
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
    """Write concat(kv_c, k_pe) of each token into its latent cache slot."""
    _write_slots(kv_cache, slot_mapping, torch.cat([kv_c, k_pe], dim=-1), scale)
