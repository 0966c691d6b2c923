"""Reference compressed-KV ops (DeepSeek-V4's CSA and HCA): the compressor's gated
window pooling, the Lightning Indexer's top-k and the sliding + compressed attention.
Plain loops over windows and query rows in fp64, so each reads like its contract."""

from __future__ import annotations

import torch

from ._registry import KERNELS


def _slots(table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat cache slots of `positions` in the sequence whose block table is `table`."""
    return table.long()[positions // block_size] * block_size + positions % block_size


def _entry_slots(table: torch.Tensor, entries: torch.Tensor, rate: int, block_size: int) -> torch.Tensor:
    """Slots of compressed entries: entry w sits at its window's last position."""
    return _slots(table, (entries + 1) * rate - 1, block_size)


def _query_positions(seq_lens: torch.Tensor, query_start_loc: torch.Tensor) -> list[tuple[int, int, int]]:
    """(sequence, query row, absolute position) of every query row."""
    rows = []
    for b in range(seq_lens.shape[0]):
        first, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        start = int(seq_lens[b]) - (end - first)
        rows.extend((b, first + i, start + i) for i in range(end - first))
    return rows


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
    """One gated softmax pool per window (and its predecessor's first half with overlap)."""
    _, block_size, width = state_cache.shape
    flat = state_cache.reshape(-1, width).double()
    rate, dim = position_bias.shape[0], out.shape[1]
    features = width // 2  # kv | gate
    bias = position_bias.double()
    for n in range(window_seq.shape[0]):
        table, window = block_tables[int(window_seq[n])], int(window_index[n])

        def window_rows(w: int) -> tuple[torch.Tensor, torch.Tensor]:
            rows = flat[_slots(table, torch.arange(w * rate, (w + 1) * rate), block_size)]
            return rows[:, :features], rows[:, features:] + bias

        kv, gate = window_rows(window)
        if overlap:
            kv, gate = kv[:, dim:], gate[:, dim:]
            if window > 0:
                prev_kv, prev_gate = window_rows(window - 1)
                kv, gate = torch.cat([prev_kv[:, :dim], kv]), torch.cat([prev_gate[:, :dim], gate])
        out[n] = (torch.softmax(gate, dim=0) * kv).sum(dim=0)


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
    """Score every visible compressed key per query row; keep the best top_k."""
    block_size = key_cache.shape[1]
    keys_flat = key_cache.reshape(-1, key_cache.shape[2]).double()
    ids.fill_(-1)
    for b, row, position in _query_positions(seq_lens, query_start_loc):
        visible = (position + 1) // compress_rate
        if visible == 0:
            continue
        keys = keys_flat[_entry_slots(block_tables[b], torch.arange(visible), compress_rate, block_size)]
        per_head = torch.relu(q[row].double() @ keys.T)  # [HI, visible]
        scores = scale * (weights[row].double()[:, None] * per_head).sum(dim=0)
        # Best first; among equal scores the lower entry (a stable sort of -score).
        order = sorted(range(visible), key=lambda w: (-float(scores[w]), w))[:top_k]
        ids[row, : len(order)] = torch.tensor(order)


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
    """Per query row: softmax over its window's keys, its compressed entries and the sink."""
    block_size, dim = kv_cache.shape[1], kv_cache.shape[2]
    kv_flat = kv_cache.reshape(-1, dim).double()
    for b, row, position in _query_positions(seq_lens, query_start_loc):
        table = block_tables[b]
        window = torch.arange(max(0, position - sliding_window + 1), position + 1)
        keys = [kv_flat[_slots(table, window, block_size)]]
        if compressed_cache is not None:
            visible = (position + 1) // compress_rate
            entries = torch.arange(visible)
            if topk_ids is not None:
                chosen = topk_ids[row].long()
                entries = chosen[(chosen >= 0) & (chosen < visible)]
            slots = _entry_slots(table, entries, compress_rate, block_size)
            keys.append(compressed_cache.reshape(-1, dim).double()[slots])
        k = torch.cat(keys)
        logits = scale * (q[row].double() @ k.T)  # [H, S]
        if sinks is not None:
            logits = torch.cat([logits, sinks.double()[:, None]], dim=1)
        probs = torch.softmax(logits, dim=1)[:, : k.shape[0]]
        out[row] = probs @ k
