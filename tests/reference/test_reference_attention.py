"""paged_attention and mla_attention against torch's scaled_dot_product_attention on
each sequence's contiguous keys and values, with an explicit mask.

The batches mix a fresh prefill, a later prefill chunk and decodes in one call, and
their block tables point at physical blocks out of order.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

BLOCK_SIZE, NUM_BLOCKS = 4, 16
#: (cached length, new query rows) per sequence: a whole prefill, a decode, a chunk
#: of a longer prefill, another decode.
MIXED = ((6, 6), (9, 1), (11, 4), (3, 1))


@dataclass
class PagedLayout:
    """The metadata of MIXED: block tables pointing at shuffled physical blocks."""

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor


def _layout(index_dtype: torch.dtype) -> PagedLayout:
    max_blocks = max(-(-n // BLOCK_SIZE) for n, _ in MIXED)
    physical = torch.randperm(NUM_BLOCKS)
    block_tables = torch.full((len(MIXED), max_blocks), -1)
    used = 0
    for b, (seq_len, _) in enumerate(MIXED):
        count = -(-seq_len // BLOCK_SIZE)
        block_tables[b, :count] = physical[used : used + count]
        used += count
    query_lens = torch.tensor([q for _, q in MIXED])
    return PagedLayout(
        block_tables.to(index_dtype),
        torch.tensor([n for n, _ in MIXED], dtype=index_dtype),
        F.pad(query_lens.cumsum(0), (1, 0)).to(index_dtype),
    )


def _cached(layout: PagedLayout, entry: tuple[int, ...], dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Random per-sequence tokens [seq_len, *entry], and a cache holding them (NaN
    elsewhere) placed position by position through the block tables."""
    cache = torch.full((NUM_BLOCKS, BLOCK_SIZE, *entry), float("nan")).to(dtype)
    contiguous = []
    for b, (seq_len, _) in enumerate(MIXED):
        tokens = torch.randn(seq_len, *entry).to(dtype)
        for position in range(seq_len):
            cache[layout.block_tables[b, position // BLOCK_SIZE], position % BLOCK_SIZE] = tokens[position]
        contiguous.append(tokens)
    return contiguous, cache


def _causal_mask(q_len: int, seq_len: int, sliding_window: int = 0) -> torch.Tensor:
    """Query row i sits at position seq_len - q_len + i; True where it may attend."""
    mask = torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=seq_len - q_len)
    if sliding_window > 0:
        mask &= ~torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=seq_len - q_len - sliding_window)
    return mask


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA in fp64 on [rows, heads, dim] tensors (kv heads already expanded)."""
    q, k, v = (t.double().transpose(0, 1) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(0, 1)


def _expected_gqa(query, keys, values, group, sliding_window, scale) -> torch.Tensor:
    rows = []
    start = 0
    for k, v, (seq_len, q_len) in zip(keys, values, MIXED):
        mask = _causal_mask(q_len, seq_len, sliding_window)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        rows.append(_sdpa(query[start : start + q_len], k, v, mask, scale))
        start += q_len
    return torch.cat(rows)


@dataclass
class GqaCase:
    """A query batch over key and value caches laid out by one PagedLayout."""

    query: torch.Tensor
    layout: PagedLayout
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_cache: torch.Tensor
    value_cache: torch.Tensor

    def run(self, ops, **params) -> torch.Tensor:
        m = self.layout
        return ops.paged_attention(
            self.query, self.key_cache, self.value_cache, m.block_tables, m.seq_lens, m.query_start_loc, **params
        )


def _gqa_case(
    index_dtype=torch.int32, q_heads=4, kv_heads=2, cache_dtype=torch.float32, query_dtype=torch.float32
) -> GqaCase:
    head_dim = 8
    layout = _layout(index_dtype)
    keys, key_cache = _cached(layout, (kv_heads, head_dim), cache_dtype)
    values, value_cache = _cached(layout, (kv_heads, head_dim), cache_dtype)
    query = torch.randn(sum(q for _, q in MIXED), q_heads, head_dim).to(query_dtype)
    return GqaCase(query, layout, keys, values, key_cache, value_cache)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("q_heads,kv_heads", [(2, 2), (4, 2), (4, 1)])
def test_paged_attention_matches_sdpa_on_mixed_prefill_and_decode(ops, index_dtype, q_heads, kv_heads) -> None:
    case = _gqa_case(index_dtype, q_heads, kv_heads)
    out = case.run(ops, scale=0.35)
    expected = _expected_gqa(case.query, case.keys, case.values, q_heads // kv_heads, 0, 0.35)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sliding_window", [2, 3])
def test_paged_attention_sliding_window_sees_only_the_last_w_positions(ops, sliding_window) -> None:
    case = _gqa_case()
    out = case.run(ops, scale=0.3, sliding_window=sliding_window)
    expected = _expected_gqa(case.query, case.keys, case.values, 2, sliding_window, 0.3)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_paged_attention_window_of_one_returns_each_rows_own_value(ops) -> None:
    case = _gqa_case(q_heads=2, kv_heads=2)
    out = case.run(ops, scale=1.0, sliding_window=1)
    own = torch.cat([v[seq_len - q_len :] for v, (seq_len, q_len) in zip(case.values, MIXED)])
    torch.testing.assert_close(out, own)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_paged_attention_reads_an_fp8_cache_as_stored_times_scale(ops, fp8_dtype) -> None:
    k_scale, v_scale = 0.25, 3.0
    case = _gqa_case(cache_dtype=fp8_dtype)
    out = case.run(ops, scale=0.5, k_scale=k_scale, v_scale=v_scale)
    dequantised_k = [k.float() * k_scale for k in case.keys]
    dequantised_v = [v.float() * v_scale for v in case.values]
    expected = _expected_gqa(case.query, dequantised_k, dequantised_v, 2, 0, 0.5)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_paged_attention_bf16_matches_sdpa_to_bf16_rounding(ops) -> None:
    case = _gqa_case(cache_dtype=torch.bfloat16, query_dtype=torch.bfloat16)
    out = case.run(ops, scale=0.4)
    assert out.dtype == torch.bfloat16
    expected = _expected_gqa(case.query, case.keys, case.values, 2, 0, 0.4)
    torch.testing.assert_close(out.double(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cache_dtype,kv_scale", [(torch.float32, 1.0), (torch.float8_e4m3fn, 0.5)])
def test_mla_attention_matches_sdpa_with_latent_and_rope_as_key_and_latent_as_value(ops, cache_dtype, kv_scale) -> None:
    heads, latent_dim, rope_dim, scale = 3, 8, 4, 0.2
    layout = _layout(torch.int64)
    cached, cache = _cached(layout, (latent_dim + rope_dim,), cache_dtype)
    rows = sum(q for _, q in MIXED)
    q_latent, q_pe = torch.randn(rows, heads, latent_dim), torch.randn(rows, heads, rope_dim)
    out = ops.mla_attention(
        q_latent, q_pe, cache, layout.block_tables, layout.seq_lens, layout.query_start_loc,
        scale=scale, kv_scale=kv_scale,
    )
    query = torch.cat([q_latent, q_pe], dim=-1)
    expected, start = [], 0
    for tokens, (seq_len, q_len) in zip(cached, MIXED):
        c = (tokens.float() * kv_scale)[:, None].expand(-1, heads, -1)  # one latent head shared by all
        mask = _causal_mask(q_len, seq_len)
        expected.append(_sdpa(query[start : start + q_len], c, c[..., :latent_dim], mask, scale))
        start += q_len
    torch.testing.assert_close(out.double(), torch.cat(expected), rtol=1e-5, atol=1e-6)
