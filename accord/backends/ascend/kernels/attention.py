"""paged_attention and mla_attention on npu_fused_infer_attention_score (FIA) over the
paged cache.

On Atlas A2/A3 FIA's page-attention form needs block sizes that are multiples of 128
for prompt rows (Q_S > 1) and its TND varlen layout takes no block table, while the
incremental form (Q_S = 1) takes any 16-aligned block size up to 512. So every query
row of the step, prefill or decode, becomes one Q_S = 1 batch entry whose kv length
ends at the row's own position: causality is the kv length, one FIA call covers the
whole varlen step, and a sliding window is a (B, KV_S) mask. MLA is the same call with
one kv head whose key and value are the latent cache rows [L+R] (the output keeps the
first L dims): FIA's rope-split MLA form would need separate latent and rope caches,
which the contract's concatenated cache does not give.

Restrictions declared: query fp16/bf16 (FIA has no fp32 path); caches of the query's
dtype (FIA's page attention reads fp16/bf16/int8, no fp8); block_tables int32 (FIA's
block_table is int32 only: a declared adapter narrows int64 tables at the boundary);
block size a multiple of 16 up to 512; head dim (MLA: L+R) up to 512.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ....op_contracts import CastAdapter, ContractError, KernelSet

HALF_DTYPES = (torch.float16, torch.bfloat16)
MAX_BLOCK_SIZE, BLOCK_ALIGN, MAX_HEAD_DIM = 512, 16, 512
#: FIA block sizes accord may configure for this backend.
BLOCK_SIZES = tuple(range(BLOCK_ALIGN, MAX_BLOCK_SIZE + 1, BLOCK_ALIGN))


@dataclass(frozen=True)
class RowBatch:
    """A varlen step as FIA batch entries, one per owned query row: the rows' span,
    each row's sequence (to pick its block-table row) and kv length (its position + 1)."""

    first: int
    last: int
    sequence: torch.Tensor
    kv_lens: torch.Tensor


def row_batch(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> RowBatch:
    """Read the metadata once on the host (FIA takes kv lengths as a host int list)."""
    starts, lens = query_start_loc.cpu().long(), seq_lens.cpu().long()
    q_lens = starts[1:] - starts[:-1]
    sequence = torch.repeat_interleave(torch.arange(q_lens.numel()), q_lens)
    first = int(starts[0])
    row_in_sequence = torch.arange(sequence.numel()) + first - starts[sequence]
    kv_lens = lens[sequence] - q_lens[sequence] + row_in_sequence + 1
    return RowBatch(first, first + sequence.numel(), sequence, kv_lens)


def _check_shapes(op: str, cache: str, block_size: int, head_dim: int) -> None:
    if block_size % BLOCK_ALIGN or not 0 < block_size <= MAX_BLOCK_SIZE:
        raise ContractError(op, cache, f"a block size that is a multiple of {BLOCK_ALIGN} up to {MAX_BLOCK_SIZE} "
                            "(FIA page attention)", str(block_size), "ascend")
    if head_dim > MAX_HEAD_DIM:
        raise ContractError(op, cache, f"a head dim up to {MAX_HEAD_DIM} (FIA)", str(head_dim), "ascend")


def _attend_rows(
    npu: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_heads: int,
    block_tables: torch.Tensor,
    rows: RowBatch,
    scale: float,
    sliding_window: int,
) -> torch.Tensor:
    """FIA over the owned rows of `query` [T, N, D]; key/value [NB, BS, kv_heads * D].
    Returns [rows, N, D] at the query's dtype."""
    block_size = key.shape[1]
    device = query.device
    table = block_tables.index_select(0, rows.sequence.to(device)).contiguous()
    mask = None
    if sliding_window > 0:
        positions = torch.arange(table.shape[1] * block_size)
        mask = (positions[None, :] <= rows.kv_lens[:, None] - 1 - sliding_window).to(device)
    attended, _ = npu.npu_fused_infer_attention_score(
        query[rows.first : rows.last].unsqueeze(1).contiguous(),
        key,
        value,
        atten_mask=mask,
        actual_seq_lengths_kv=rows.kv_lens.tolist(),
        block_table=table,
        num_heads=query.shape[1],
        scale=scale,
        input_layout="BSND",
        num_key_value_heads=kv_heads,
        sparse_mode=0,
        block_size=block_size,
    )
    return attended[:, 0]


def _write(out: torch.Tensor, rows: RowBatch, attended: torch.Tensor) -> None:
    """Owned rows get their attention; padding rows no sequence owns are zeroed."""
    out[: rows.first].zero_()
    out[rows.last :].zero_()
    out[rows.first : rows.last] = attended


def paged_attention(
    npu: Any,
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
    """GQA attention: FIA with num_key_value_heads = Hk over the caches seen as
    [NB, BS, Hk*D] (the contract's layout, unchanged)."""
    blocks, block_size, kv_heads, head_dim = key_cache.shape
    _check_shapes("paged_attention", "key_cache", block_size, head_dim)
    rows = row_batch(query_start_loc, seq_lens)
    flat = (blocks, block_size, kv_heads * head_dim)
    attended = _attend_rows(npu, query, key_cache.view(flat), value_cache.view(flat), kv_heads, block_tables,
                            rows, scale, sliding_window)
    _write(out, rows, attended)


def mla_attention(
    npu: Any,
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
    """Latent attention as FIA with one kv head: query concat(q_latent, q_pe), key and
    value both the cached concat rows; the output's first L dims are the result."""
    _check_shapes("mla_attention", "kv_cache", kv_cache.shape[1], kv_cache.shape[2])
    rows = row_batch(query_start_loc, seq_lens)
    query = torch.cat([q_latent, q_pe], dim=-1)
    attended = _attend_rows(npu, query, kv_cache, kv_cache, 1, block_tables, rows, scale, 0)
    _write(out, rows, attended[..., : q_latent.shape[2]])


def register(kernels: KernelSet, npu: Any) -> None:
    """Add both attention kernels with their declared dtype limits and adapter."""
    int32_tables = (CastAdapter("block_tables", torch.int32),)
    kernels.register(
        "paged_attention",
        claims={"query": HALF_DTYPES, "key_cache": HALF_DTYPES, "block_tables": (torch.int32,)},
        adapters=int32_tables,
    )(partial(paged_attention, npu))
    kernels.register(
        "mla_attention",
        claims={"q_latent": HALF_DTYPES, "kv_cache": HALF_DTYPES, "block_tables": (torch.int32,)},
        adapters=int32_tables,
    )(partial(mla_attention, npu))
