"""npu_fused_infer_attention_score in the form accord calls it: incremental attention
(query S = 1) over a paged cache, BSND query, optional (B, KV_S) mask. The paged-cache
restrictions are the ones torch-npu documents for Q_S = 1 on Atlas A2/A3; other forms
(prompt attention Q_S > 1, TND, rope split, quantisation, shared prefixes) refuse as not
emulated, so a glue change that starts using one fails here until it is emulated."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ._checks import HALVES, NpuOperatorError, contiguous, dtype_in, rank_in, require, same_dtype

#: Documented limits of the Q_S = 1 (incremental) path.
MAX_BATCH, MAX_HEADS, MAX_HEAD_DIM, MAX_KV_LEN, MAX_GROUP = 65536, 256, 512, 262144, 64
MAX_BLOCK_SIZE, BLOCK_ALIGN = 512, 16
_MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)


def _check_paged(op: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_table: torch.Tensor | None,
                 block_size: int, num_heads: int, num_key_value_heads: int) -> tuple[int, int, int]:
    """(kv heads, head dim, cache positions per sequence) after the documented checks."""
    batch, q_len, heads, head_dim = query.shape
    require(q_len == 1, op, "query", "S = 1 (the prompt path Q_S > 1 is not emulated)", q_len)
    require(block_table is not None, op, "block_table", "a tensor (only the page-attention form is emulated)", None)
    assert block_table is not None
    dtype_in(op, "block_table", block_table, (torch.int32,))
    rank_in(op, "block_table", block_table, (2,))
    require(block_table.shape[0] == batch, op, "block_table", f"{batch} rows (B)", tuple(block_table.shape))
    rank_in(op, "key", key, (3,))
    require(key.shape == value.shape, op, "value", f"key's shape {tuple(key.shape)}", tuple(value.shape))
    require(block_size == key.shape[1], op, "block_size", f"the cache's block axis {key.shape[1]}", block_size)
    require(0 < block_size <= MAX_BLOCK_SIZE and block_size % BLOCK_ALIGN == 0, op, "block_size",
            f"a multiple of {BLOCK_ALIGN} up to {MAX_BLOCK_SIZE} for fp16/bf16 caches", block_size)
    require(num_heads == heads, op, "num_heads", f"query's N={heads}", num_heads)
    kv_heads = num_key_value_heads or heads
    require(heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP, op, "num_key_value_heads",
            f"a divisor of num_heads with ratio <= {MAX_GROUP}", kv_heads)
    require(key.shape[2] == kv_heads * head_dim, op, "key", f"H = num_key_value_heads * D = {kv_heads * head_dim}", key.shape[2])
    require(batch <= MAX_BATCH and heads <= MAX_HEADS and head_dim <= MAX_HEAD_DIM, op, "query",
            f"B <= {MAX_BATCH}, N <= {MAX_HEADS}, D <= {MAX_HEAD_DIM}", tuple(query.shape))
    return kv_heads, head_dim, block_table.shape[1] * block_size


def npu_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | None = None,
    actual_seq_lengths_kv: Sequence[int] | None = None,
    block_table: torch.Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    block_size: int = 0,
    **unemulated: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention_out, softmax_lse placeholder): softmax(scale * q k^T + mask) v per
    batch entry over its first actual_seq_lengths_kv[b] cached positions, read through
    block_table from key/value [NB, BS, KV_N * D]. query is BSND [B, 1, N, D] fp16/bf16,
    key/value of query's dtype, everything contiguous; block_table int32; the mask, when
    given, is (B, KV_S) with KV_S = block_table columns * BS, true/1 = masked."""
    op = "npu_fused_infer_attention_score"
    for name, value_ in unemulated.items():
        if value_ is not None and value_ is not False:
            raise NpuOperatorError(op, name, "absent (this form is not emulated)", type(value_).__name__)
    require(input_layout == "BSND", op, "input_layout", "'BSND' (the emulated form)", input_layout)
    dtype_in(op, "query", query, HALVES)
    rank_in(op, "query", query, (4,))
    same_dtype(op, "key", key, "query", query)
    same_dtype(op, "value", value, "query", query)
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        contiguous(op, name, tensor)
    kv_heads, head_dim, kv_span = _check_paged(op, query, key, value, block_table, block_size, num_heads, num_key_value_heads)
    assert block_table is not None
    batch, _, heads, _ = query.shape
    require(actual_seq_lengths_kv is not None and len(actual_seq_lengths_kv) >= batch, op, "actual_seq_lengths_kv",
            f"given with at least B={batch} entries (page attention requires it)", actual_seq_lengths_kv)
    assert actual_seq_lengths_kv is not None
    lengths = torch.tensor(list(actual_seq_lengths_kv)[:batch])
    require(bool(((lengths >= 0) & (lengths <= min(kv_span, MAX_KV_LEN))).all()), op, "actual_seq_lengths_kv",
            f"in [0, {kv_span}] (the block table's reach)", lengths.tolist())
    positions = torch.arange(kv_span)
    visible = positions[None, :] < lengths[:, None]  # [B, KV_S]
    if atten_mask is not None:
        require(sparse_mode == 0, op, "sparse_mode", "0 with a (B, KV_S) mask", sparse_mode)
        dtype_in(op, "atten_mask", atten_mask, _MASK_DTYPES)
        require(tuple(atten_mask.shape) == (batch, kv_span), op, "atten_mask", f"(B, KV_S) = {(batch, kv_span)}", tuple(atten_mask.shape))
        visible &= ~atten_mask.bool()
    blocks = block_table.long()
    require(bool(((blocks >= 0) & (blocks < key.shape[0])).all()), op, "block_table", f"block ids in [0, {key.shape[0]})", "out of range")
    # The operator reads only the first actual_seq_lengths_kv positions: whatever the
    # cache holds past them (stale or poisoned memory) must not reach the output.
    # Computed in fp64: the padded KV span changes with the batch, and so does a GEMM's
    # summation order; fp64 keeps that below the output's rounding, so a sequence's result
    # does not depend on its batch (as the operator's is).
    keys = key.view(key.shape[0], key.shape[1], kv_heads, head_dim)[blocks].flatten(1, 2).double()
    values = value.view(key.shape[0], key.shape[1], kv_heads, head_dim)[blocks].flatten(1, 2).double()
    keys = torch.where(visible[..., None, None], keys, 0.0)
    values = torch.where(visible[..., None, None], values, 0.0)
    group = heads // kv_heads
    q = query[:, 0].double().view(batch, kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,bshd->bhgs", q, keys) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with nothing visible yields zeros
    out = torch.einsum("bhgs,bshd->bhgd", weights, values).reshape(batch, 1, heads, head_dim)
    return out.to(query.dtype), torch.zeros(1, dtype=torch.float32)
