"""Compressed-KV ops (DeepSeek-V4's CSA and HCA) on CPUs: every window of a step pooled
in one batched gather, and the indexer and attention computed per sequence as one
masked dense block over its window and its compressed entries, in fp32."""

from __future__ import annotations

import torch

from ._registry import KERNELS


def _slots(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat cache slots of `positions` [N, M], row n read through block table row n."""
    return tables.gather(1, positions // block_size) * block_size + positions % block_size


@KERNELS.register("kv_compress")
def kv_compress(
    state_cache: torch.Tensor,
    position_bias: torch.Tensor,
    block_tables: torch.Tensor,
    window_seq: torch.Tensor,
    window_index: torch.Tensor,
    overlap: bool,
    out: torch.Tensor,
) -> None:
    """Gather every window's rows at once; softmax-pool over the window's slots."""
    _, block_size, width = state_cache.shape
    flat = state_cache.reshape(-1, width)
    rate, dim, features = position_bias.shape[0], out.shape[1], width // 2
    tables = block_tables.long().index_select(0, window_seq.long())
    windows = window_index.long()[:, None]
    offsets = torch.arange(rate, device=flat.device)[None, :]
    rows = flat[_slots(tables, windows * rate + offsets, block_size)].float()  # [N, R, 2F]
    kv, gate = rows[..., :features], rows[..., features:] + position_bias
    if overlap:
        previous = flat[_slots(tables, (windows - 1).clamp(min=0) * rate + offsets, block_size)].float()
        prev_gate = (previous[..., features : features + dim] + position_bias[:, :dim]).masked_fill(
            (windows == 0)[..., None], float("-inf")
        )
        kv = torch.cat([previous[..., :dim], kv[..., dim:]], dim=1)
        gate = torch.cat([prev_gate, gate[..., dim:]], dim=1)
    out.copy_((torch.softmax(gate, dim=1) * kv).sum(dim=1))


def _sequences(seq_lens: torch.Tensor, query_start_loc: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(sequence, first query row, query count, first query position) per sequence."""
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    return [(b, starts[b], starts[b + 1] - starts[b], lens[b] - (starts[b + 1] - starts[b])) for b in range(len(lens))]


def _entries(cache: torch.Tensor, table: torch.Tensor, count: int, rate: int) -> torch.Tensor:
    """The first `count` compressed entries [count, D] of one sequence, as fp32."""
    block_size = cache.shape[1]
    positions = (torch.arange(count, device=cache.device) + 1) * rate - 1
    slots = table.long()[positions // block_size] * block_size + positions % block_size
    return cache.reshape(-1, cache.shape[2])[slots].float()


@KERNELS.register("indexer_topk")
def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    top_k: int,
    compress_rate: int,
    scale: float,
    ids_dtype: torch.dtype,
    ids: torch.Tensor,
) -> None:
    """Per sequence: all its rows against all its visible keys, masked, stably sorted."""
    ids.fill_(-1)
    for b, first, count, start in _sequences(seq_lens, query_start_loc):
        positions = torch.arange(start, start + count, device=q.device)
        visible = (positions + 1) // compress_rate
        total = int(visible[-1]) if count else 0
        if total == 0:
            continue
        keys = _entries(key_cache, block_tables[b], total, compress_rate)
        # Scored in fp64 and rounded to fp32: a GEMM may sum the columns of equal keys in
        # different orders (tail tiles), and fp64 makes those sums agree to well below an
        # fp32 ulp, so equal keys tie exactly and the contract's tie rule decides.
        per_head = torch.relu(torch.einsum("nhd,ed->nhe", q[first : first + count].double(), keys.double()))
        scores = (scale * (weights[first : first + count, :, None].double() * per_head).sum(dim=1)).float()
        scores = scores.masked_fill(torch.arange(total, device=q.device)[None, :] >= visible[:, None], float("-inf"))
        # A stable descending sort puts equal scores in entry order (the contract's tie rule).
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :top_k]
        chosen = torch.where(order < visible[:, None], order, -1)
        ids[first : first + count, : chosen.shape[1]] = chosen.to(ids.dtype)


@KERNELS.register("compressed_attention")
def compressed_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    compressed_cache: torch.Tensor | None,
    sinks: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int,
    compress_rate: int,
    out: torch.Tensor,
) -> None:
    """Per sequence: one masked softmax over [window keys | compressed entries | sink]."""
    block_size, dim = kv_cache.shape[1], kv_cache.shape[2]
    kv_flat = kv_cache.reshape(-1, dim)
    heads = q.shape[1]
    for b, first, count, start in _sequences(seq_lens, query_start_loc):
        if count == 0:
            continue
        table = block_tables[b].long()
        positions = torch.arange(start, start + count, device=q.device)
        key_positions = torch.arange(max(0, start - sliding_window + 1), start + count, device=q.device)
        keys = kv_flat[table[key_positions // block_size] * block_size + key_positions % block_size].float()
        delta = positions[:, None] - key_positions[None, :]
        allowed = (delta >= 0) & (delta < sliding_window)
        if compressed_cache is not None:
            visible = (positions + 1) // compress_rate
            total = int(visible[-1])
            entry_ids = torch.arange(total, device=q.device)[None, :]
            entry_allowed = entry_ids < visible[:, None]
            if topk_ids is not None:
                chosen = topk_ids[first : first + count].long()
                entry_allowed &= (chosen[:, :, None] == entry_ids[:, None, :]).any(dim=1)
            keys = torch.cat([keys, _entries(compressed_cache, table, total, compress_rate)])
            allowed = torch.cat([allowed, entry_allowed], dim=1)
        logits = scale * torch.einsum("nhd,kd->hnk", q[first : first + count].float(), keys)
        logits = logits.masked_fill(~allowed[None], float("-inf"))
        if sinks is not None:
            logits = torch.cat([logits, sinks.float()[:, None, None].expand(heads, count, 1)], dim=2)
        probs = torch.softmax(logits, dim=2)[..., : keys.shape[0]]
        out[first : first + count] = torch.einsum("hnk,kd->nhd", probs, keys).to(out.dtype)
