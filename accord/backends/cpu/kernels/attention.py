"""Paged attention (GQA) and MLA attention over block-table caches.

Decode rows go to a C kernel that reads the paged caches in place (_native_attention)
wherever it is built and takes the tensors' dtypes. Otherwise (fp8 or fp16 tensors, no
C compiler) decodes are batched: the blocks of every decoding sequence of similar length
are gathered into one padded tensor and a single scaled_dot_product_attention call
attends them all under a length mask, each kv head's query group folded into the query
axis.
Prefill chunks take one SDPA call per run of like chunks (same query and cached
lengths) with their causal (and window) mask.
Attention runs in fp32 on every host, as the contract's fp32 softmax requires: torch's
masked bf16 SDPA rounds scores and probabilities to bf16 (on AVX512-BF16 hosts that
broke the tiny Mixtral's logit parity with transformers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _native_attention
from ._paged import STEP_PLANS, DecodeBatch, PagedKV, StepPlan, visible
from ._registry import KERNELS


def _attend_decodes(
    query: torch.Tensor, kv: PagedKV, batch: DecodeBatch, scale: float, out: torch.Tensor
) -> None:
    """One padded SDPA call for single-row sequences; query is [T, Hk, G, Dk] in the
    fp32, out is [T, Hq, Dv]."""
    keys, values = kv.gather(batch.block_ids, query.dtype)
    # Padded slots hold whatever the cache held (NaN poison, say), and 0 * NaN is NaN
    # even under a -inf score: zero them so masked positions contribute exactly 0.
    # (Attending the cache in place would skip the copy, but SDPA's bits depend on the
    # key length, so a sequence would get other bits alone than in a padded batch.)
    n, padded_len = batch.visible.shape[0], batch.visible.shape[-1]
    if batch.padding.numel():
        keys.view(n * padded_len, *keys.shape[2:]).index_fill_(0, batch.padding, 0)
        if kv.value_cache is not None:
            values.view(n * padded_len, *values.shape[2:]).index_fill_(0, batch.padding, 0)
    span = batch.row_span
    attended = F.scaled_dot_product_attention(
        # [n, Hk, G, Dk]: the group is the query axis
        query[span[0] : span[1]] if span else query.index_select(0, batch.rows),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=batch.visible,
        scale=scale,
    ).reshape(n, out.shape[1], out.shape[2])
    if span:
        out[span[0] : span[1]].copy_(attended)
    else:
        out.index_copy_(0, batch.rows, attended.to(out.dtype))


#: The most key positions one prefill SDPA call takes over its sequences together: runs
#: of like chunks are attended in one call up to this (its gathered, group-repeated keys
#: and values stay as small as one long sequence's).
PREFILL_CALL_POSITIONS = 8192


def _attend_prefills(
    query: torch.Tensor,
    kv: PagedKV,
    block_tables: torch.Tensor,
    first_row: int,
    q_len: int,
    seq_len: int,
    scale: float,
    sliding_window: int,
    out: torch.Tensor,
) -> None:
    """The chunks of a run of sequences (`block_tables` [n, ...], their rows) alike in
    shape: q_len query rows each, back to back from `first_row`, against seq_len cached
    positions each; one SDPA call (GQA). SDPA computes each sequence of its batch as it
    would alone, bit for bit, so a sequence's result does not depend on its company; one
    call instead of one per sequence saves the per-call costs (SDPA alone over 128
    sixteen-token prompts, a profile run's layer: 0.4x the time of 128 calls)."""
    n = block_tables.shape[0]
    blocks = -(-seq_len // kv.block_size)
    keys, values = kv.gather(block_tables[:, :blocks].long(), query.dtype)
    rows = slice(first_row, first_row + n * q_len)
    q = query[rows].flatten(1, 2).unflatten(0, (n, q_len)).transpose(1, 2)  # [n, Hq, q_len, Dk]
    # torch's fused CPU attention takes 4-D inputs with equal head counts only (4-D
    # with enable_gqa falls back to the unfused math path, several times slower), so
    # each kv head is repeated for its query group.
    group = query.shape[2]
    keys, values = (t[:, :seq_len].repeat_interleave(group, dim=2).transpose(1, 2) for t in (keys, values))
    # SDPA's is_causal aligns the top-left corner; only a whole-sequence chunk matches.
    full_causal = q_len == seq_len and sliding_window == 0
    mask = None
    if not full_causal:
        query_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        mask = visible(query_pos, torch.arange(seq_len), torch.tensor(seq_len), sliding_window)
    attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=full_causal, scale=scale)
    out[rows].view(n, q_len, *out.shape[1:]).copy_(attended.transpose(1, 2))


def _attend_step(
    query: torch.Tensor,
    kv: PagedKV,
    block_tables: torch.Tensor,
    plan: StepPlan,
    scale: float,
    sliding_window: int,
    out: torch.Tensor,
    decodes_done: bool,
) -> None:
    """Attention of every sequence of the step; query is [T, Hk, G, Dk] in fp32.
    Rows no sequence owns are zeroed. With `decodes_done` the C kernel has already
    attended the single-row sequences and zeroed those rows: only prefills are left."""
    layout = plan.layout
    if not decodes_done:
        first, last = layout.owned_rows
        if first > 0:
            out[:first].zero_()
        if last < out.shape[0]:
            out[last:].zero_()
        for batch in plan.decode_batches:
            _attend_decodes(query, kv, batch, scale, out)
    prefills, i = layout.prefills, 0
    while i < len(prefills):
        b, start, q_len, seq_len = prefills[i]
        # The run of next sequences with the same chunk shape, rows back to back.
        n = 1
        while (
            i + n < len(prefills)
            and prefills[i + n] == (b + n, start + n * q_len, q_len, seq_len)
            and (n + 1) * seq_len <= PREFILL_CALL_POSITIONS
        ):
            n += 1
        _attend_prefills(query, kv, block_tables[b : b + n], start, q_len, seq_len, scale, sliding_window, out)
        i += n


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
    metadata = (block_tables, seq_lens, query_start_loc)
    left = _native_attention.attend_decodes(query, key_cache, value_cache, *metadata, scale, sliding_window, out)
    if left == 0 or (
        left is not None
        and _native_attention.attend_prefills(query, key_cache, value_cache, *metadata, scale, sliding_window, out)
    ):
        return
    tokens, q_heads, head_dim = query.shape
    kv_heads = key_cache.shape[2]
    grouped = query.float().view(tokens, kv_heads, q_heads // kv_heads, head_dim)
    kv = PagedKV(key_cache, value_cache, head_dim, k_scale, v_scale)
    plan = STEP_PLANS.plan(query_start_loc, seq_lens, block_tables, kv.block_size, sliding_window)
    _attend_step(grouped, kv, block_tables, plan, scale, sliding_window, out, decodes_done=left is not None)


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
    """Latent attention: one kv head whose key is concat(latent, rope) and whose value
    is the latent, so every query head is in one group."""
    query = torch.cat([q_latent.float(), q_pe.float()], dim=-1)  # [T, H, L+R]
    latent = kv_cache.unsqueeze(2)  # one kv head: keys are all L+R channels, values the first L
    metadata = (block_tables, seq_lens, query_start_loc)
    left = _native_attention.attend_decodes(query, latent, latent, *metadata, scale, 0, out)
    if left == 0 or (
        left is not None and _native_attention.attend_prefills(query, latent, latent, *metadata, scale, 0, out)
    ):
        return
    kv = PagedKV(latent, None, q_latent.shape[2], kv_scale, kv_scale)
    plan = STEP_PLANS.plan(query_start_loc, seq_lens, block_tables, kv.block_size, 0)
    _attend_step(query.unsqueeze(1), kv, block_tables, plan, scale, 0, out, decodes_done=left is not None)
