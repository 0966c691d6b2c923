"""The KV cache writers: npu_scatter_pa_kv_cache (key/value pages, its ND "Norm" mode,
3-D keys: scenario 2 of its documentation) and npu_scatter_nd_update_ (a row scatter
into any tensor, used for the MLA latent cache)."""

from __future__ import annotations

import torch

from ._checks import contiguous, dtype_in, rank_in, require, same_dtype

#: Key/value/cache dtypes npu_scatter_pa_kv_cache documents (no e4m3fnuz: Ascend has none).
_PA_CACHE_DTYPES = (
    torch.float16, torch.float32, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
    torch.uint16, torch.int32, torch.uint32, torch.float8_e5m2, torch.float8_e4m3fn,
)
_INDEX = (torch.int32, torch.int64)
#: npu_scatter_nd_update_ dtypes on Atlas A2/A3 (fp8 is not among them).
_ND_UPDATE_DTYPES = (torch.float32, torch.float16, torch.bool, torch.bfloat16, torch.int64, torch.int8)


def _slots_in_range(op: str, slots: torch.Tensor, num_slots: int) -> None:
    values = slots.tolist()
    require(all(0 <= s < num_slots for s in values), op, "slot_mapping", f"in [0, {num_slots - 1}] (no padding -1)", values)
    require(len(set(values)) == len(values), op, "slot_mapping", "free of repeats", values)


def npu_scatter_pa_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    compress_lens: torch.Tensor | None = None,
    compress_seq_offsets: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    cache_mode: str | None = "PA_NZ",
) -> None:
    """key_cache[s // BS, s % BS] = key[t] for s = slot_mapping[t] (value likewise).
    Only the ND form is emulated (cache_mode 'Norm'/None: caches [NB, BS, N, D], keys
    [T, N, D]); every tensor contiguous, key/value/caches of one dtype, slots int32 or
    int64 in [0, NB*BS) without repeats (no -1 padding)."""
    op = "npu_scatter_pa_kv_cache"
    require(cache_mode in (None, "Norm"), op, "cache_mode", "'Norm' or None (the NZ layout is not emulated)", cache_mode)
    require(compress_lens is None and compress_seq_offsets is None and seq_lens is None,
            op, "compress_lens", "absent (the compression scenario is not emulated)", "a tensor")
    dtype_in(op, "key", key, _PA_CACHE_DTYPES)
    for name, tensor in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        same_dtype(op, name, tensor, "key", key)
    dtype_in(op, "slot_mapping", slot_mapping, _INDEX)
    rank_in(op, "key", key, (3,))
    rank_in(op, "key_cache", key_cache, (4,))
    rank_in(op, "value_cache", value_cache, (4,))
    require(key.shape[:2] == value.shape[:2], op, "value", "of key's first two axes", tuple(value.shape))
    require(slot_mapping.shape == key.shape[:1], op, "slot_mapping", f"[{key.shape[0]}]", tuple(slot_mapping.shape))
    for name, tensor in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache), ("slot_mapping", slot_mapping)):
        contiguous(op, name, tensor)
    _slots_in_range(op, slot_mapping, key_cache.shape[0] * key_cache.shape[1])
    slots = slot_mapping.long()
    key_cache.view(-1, *key_cache.shape[2:])[slots] = key
    value_cache.view(-1, *value_cache.shape[2:])[slots] = value


def npu_scatter_nd_update_(input: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """input[indices[i]] = updates[i] in place; indices int32/int64, at least 2-D, its
    last axis a prefix of input's axes, in bounds; updates of input's dtype (A2/A3:
    fp32/fp16/bf16/int8/int64/bool) shaped indices.shape[:-1] + input.shape[a:]."""
    op = "npu_scatter_nd_update_"
    dtype_in(op, "input", input, _ND_UPDATE_DTYPES)
    same_dtype(op, "updates", updates, "input", input)
    dtype_in(op, "indices", indices, _INDEX)
    require(indices.dim() >= 2 and indices.shape[-1] <= input.dim(), op, "indices", "at least 2-D, last axis <= input's rank", tuple(indices.shape))
    depth = indices.shape[-1]
    expected = tuple(indices.shape[:-1]) + tuple(input.shape[depth:])
    require(tuple(updates.shape) == expected, op, "updates", f"shaped {expected}", tuple(updates.shape))
    flat = indices.reshape(-1, depth).long()
    for axis in range(depth):
        column = flat[:, axis]
        require(bool(((column >= 0) & (column < input.shape[axis])).all()), op, "indices", f"in bounds of axis {axis}", column.tolist())
    input[tuple(flat.t())] = updates.reshape(-1, *input.shape[depth:])
    return input
