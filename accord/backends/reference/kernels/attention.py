"""Reference paged attention (GQA) and MLA attention over block-table caches.

Both walk the varlen batch one sequence at a time: gather the sequence's cached
positions through its block table into contiguous fp64 tensors, mask what each query
row may not see, and take a plain softmax in fp64.
"""

from __future__ import annotations

import torch

from . import _fp8
from ._registry import KERNELS


def _sequences(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> list[tuple[int, int, int]]:
    """(first query row, number of query rows, cached length) of each sequence."""
    starts = query_start_loc.long().tolist()
    return [(starts[b], starts[b + 1] - starts[b], n) for b, n in enumerate(seq_lens.long().tolist())]


def _gather(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Cache positions 0..seq_len-1 of one sequence, contiguous: [seq_len, ...]."""
    positions = torch.arange(seq_len)
    block_size = cache.shape[1]
    return cache[block_table.long()[positions // block_size], positions % block_size]


def _visible(q_len: int, seq_len: int, sliding_window: int) -> torch.Tensor:
    """[q_len, seq_len] mask of the cached positions each new query row may attend to."""
    key_pos = torch.arange(seq_len)
    query_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
    visible = key_pos <= query_pos
    if sliding_window > 0:
        visible &= query_pos - key_pos < sliding_window
    return visible


def _attend(scores: torch.Tensor, visible: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """softmax(scores masked to `visible`) @ values, per head.

    scores: [H, q_len, seq_len]; values: [H, seq_len, Dv]; returns [q_len, H, Dv].
    """
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return (probs @ values).transpose(0, 1)


@KERNELS.register("paged_attention")
def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int,
    k_scale: float,
    v_scale: float,
    out: torch.Tensor,
) -> None:
    """Causal (optionally sliding-window) GQA attention of each sequence's new rows."""
    out.zero_()  # rows past query_start_loc[-1] are padding: no sequence owns them
    group = query.shape[1] // key_cache.shape[2]
    for b, (start, q_len, seq_len) in enumerate(_sequences(query_start_loc, seq_lens)):
        if q_len == 0:
            continue
        keys = _fp8.load(_gather(key_cache, block_tables[b], seq_len), k_scale)
        values = _fp8.load(_gather(value_cache, block_tables[b], seq_len), v_scale)
        # [seq_len, Hk, D] -> [Hq, seq_len, D]: query head h reads kv head h // group.
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        q = query[start : start + q_len].double().transpose(0, 1)  # [Hq, q_len, D]
        scores = scale * (q @ keys.transpose(1, 2))
        out[start : start + q_len] = _attend(scores, _visible(q_len, seq_len, sliding_window), values)


@KERNELS.register("mla_attention")
def mla_attention(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    kv_scale: float,
    out: torch.Tensor,
) -> None:
    """Causal attention of latent queries over the latent cache (weights absorbed)."""
    out.zero_()  # rows past query_start_loc[-1] are padding: no sequence owns them
    latent_dim = q_latent.shape[2]
    for b, (start, q_len, seq_len) in enumerate(_sequences(query_start_loc, seq_lens)):
        if q_len == 0:
            continue
        cached = _fp8.load(_gather(kv_cache, block_tables[b], seq_len), kv_scale)  # [seq_len, L+R]
        latent, rope = cached[:, :latent_dim], cached[:, latent_dim:]
        rows = slice(start, start + q_len)
        q_lat = q_latent[rows].double().transpose(0, 1)  # [H, q_len, L]
        q_rope = q_pe[rows].double().transpose(0, 1)  # [H, q_len, R]
        scores = scale * (q_lat @ latent.T + q_rope @ rope.T)
        heads = q_latent.shape[1]
        out[rows] = _attend(scores, _visible(q_len, seq_len, 0), latent.expand(heads, -1, -1))
