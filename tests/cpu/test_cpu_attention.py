"""cpu paged_attention and mla_attention against the reference on the shapes the
engine sends: one call mixing whole prefills, later prefill chunks and decodes, block
tables pointing at shuffled physical blocks (padded with -1), NaN in every cache slot
no sequence owns, and padding query rows past the last sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

BLOCK_SIZE = 4
#: (cached length, new query rows): a whole prefill, a decode, a chunk of a longer
#: prefill, a decode with a much longer context, a one-token sequence.
MIXED = ((6, 6), (9, 1), (11, 4), (37, 1), (1, 1))
PADDING_ROWS = 2


def _metadata(lengths: tuple[tuple[int, int], ...], index_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(block_tables, seq_lens, query_start_loc) with each sequence's blocks drawn from
    a shuffled pool and the rest of its table row -1, plus the pool's size."""
    counts = [-(-n // BLOCK_SIZE) for n, _ in lengths]
    physical = torch.randperm(sum(counts) + 3)
    block_tables = torch.full((len(lengths), max(counts) + 1), -1)
    used = 0
    for b, count in enumerate(counts):
        block_tables[b, :count] = physical[used : used + count]
        used += count
    query_lens = torch.tensor([q for _, q in lengths])
    return (
        block_tables.to(index_dtype),
        torch.tensor([n for n, _ in lengths], dtype=index_dtype),
        F.pad(query_lens.cumsum(0), (1, 0)).to(index_dtype),
        physical.numel(),
    )


def _poisoned_cache(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, entry: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """A cache with random values in every position a sequence owns and NaN elsewhere."""
    cache = torch.full((num_blocks, BLOCK_SIZE, *entry), float("nan"))
    for b, seq_len in enumerate(seq_lens.tolist()):
        positions = torch.arange(seq_len)
        slots = block_tables[b, positions // BLOCK_SIZE].long() * BLOCK_SIZE + positions % BLOCK_SIZE
        cache.view(-1, *entry)[slots] = torch.randn(seq_len, *entry)
    return cache.to(dtype)


def _paged_call(
    lengths: tuple[tuple[int, int], ...],
    index_dtype: torch.dtype = torch.int32,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    q_heads: int = 8,
    kv_heads: int = 2,
    head_dim: int = 16,
) -> tuple[torch.Tensor, ...]:
    """Arguments of a paged_attention call over `lengths`, with padding query rows."""
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(lengths, index_dtype)
    entry, stored = (kv_heads, head_dim), cache_dtype or dtype
    key_cache, value_cache = (_poisoned_cache(block_tables, seq_lens, num_blocks, entry, stored) for _ in range(2))
    query = torch.randn(int(query_start_loc[-1]) + PADDING_ROWS, q_heads, head_dim).to(dtype)
    return query, key_cache, value_cache, block_tables, seq_lens, query_start_loc


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_prefill_and_decode_batch_matches_reference(assert_matches_reference, index_dtype, dtype) -> None:
    assert_matches_reference("paged_attention", *_paged_call(MIXED, index_dtype, dtype), scale=0.25)


def test_sliding_window_matches_reference(assert_matches_reference) -> None:
    assert_matches_reference("paged_attention", *_paged_call(MIXED), scale=0.25, sliding_window=5)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_fp8_cache_is_read_times_its_scales(assert_matches_reference, fp8) -> None:
    call = _paged_call(MIXED, dtype=torch.bfloat16, cache_dtype=fp8)
    assert_matches_reference("paged_attention", *call, scale=0.25, k_scale=0.5, v_scale=2.0)


def test_decodes_of_very_different_lengths_match_reference(assert_matches_reference) -> None:
    lengths = tuple((n, 1) for n in (1, 3, 60, 7, 33, 2, 64, 17))
    assert_matches_reference("paged_attention", *_paged_call(lengths), scale=0.25)


def test_a_query_head_per_kv_head_matches_reference(assert_matches_reference) -> None:
    assert_matches_reference("paged_attention", *_paged_call(MIXED, q_heads=4, kv_heads=4), scale=0.25)


def test_rows_no_sequence_owns_are_zero(cpu_ops) -> None:
    out = cpu_ops.paged_attention(*_paged_call(MIXED), scale=0.25)
    assert torch.equal(out[-PADDING_ROWS:], torch.zeros_like(out[-PADDING_ROWS:]))


def test_a_small_call_after_a_large_one_matches_reference(cpu_ops, assert_matches_reference) -> None:
    """The kernels gather into reused scratch buffers; a smaller call must only see its
    own part of them."""
    cpu_ops.paged_attention(*_paged_call(tuple((64, 1) for _ in range(8))), scale=0.25)
    assert_matches_reference("paged_attention", *_paged_call(((5, 1), (3, 3))), scale=0.25)


def test_metadata_refilled_in_place_is_not_served_a_stale_plan(cpu_ops, reference_ops, nmse_of) -> None:
    """Each step's plan (layout, decode batch indices) is reused across layers; the
    same metadata tensors refilled in place with another step's values, or met with
    another sliding window, must get plans of their own."""
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc = _paged_call(
        tuple((n, 1) for n in (9, 30, 2))
    )
    call = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    cpu_ops.paged_attention(*call, scale=0.25)
    # Shorter contexts and two sequences' first blocks swapped, in the same tensors.
    seq_lens.copy_(torch.tensor([3, 30, 1], dtype=seq_lens.dtype))
    block_tables[[0, 1], 0] = block_tables[[1, 0], 0].clone()
    for window in (0, 2):
        got = cpu_ops.paged_attention(*call, scale=0.25, sliding_window=window)
        want = reference_ops.paged_attention(*call, scale=0.25, sliding_window=window)
        assert nmse_of(got, want) < 1e-10


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_mla_mixed_batch_matches_reference(assert_matches_reference, index_dtype, cache_dtype) -> None:
    latent, rope, heads = 32, 8, 4
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(MIXED, index_dtype)
    kv_cache = _poisoned_cache(block_tables, seq_lens, num_blocks, (latent + rope,), cache_dtype)
    rows = int(query_start_loc[-1]) + PADDING_ROWS
    q_latent, q_pe = torch.randn(rows, heads, latent), torch.randn(rows, heads, rope)
    assert_matches_reference(
        "mla_attention", q_latent, q_pe, kv_cache, block_tables, seq_lens, query_start_loc, scale=0.2, kv_scale=0.5
    )
