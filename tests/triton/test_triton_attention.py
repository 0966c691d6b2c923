"""The Triton paged attention (GQA, varlen prefill + decode, sliding window, fp8 pages)
and MLA attention kernels match the reference backend over mixed batches."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES

BLOCK_SIZE = 4
#: (query length, cached length) per sequence: a prefill chunk longer than one tile, a
#: decode, a chunk continuing a cached prefix, and a sequence with nothing new.
BATCH = ((18, 18), (1, 9), (3, 7), (0, 5))


def _metadata(index_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(block_tables, seq_lens, query_start_loc, number of blocks) for BATCH, each
    sequence's blocks scattered over the cache in a shuffled order."""
    max_blocks = max(-(-seq_len // BLOCK_SIZE) for _, seq_len in BATCH)
    num_blocks = max_blocks * len(BATCH)
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(7))
    block_tables = order.view(len(BATCH), max_blocks).to(index_dtype)
    seq_lens = torch.tensor([seq_len for _, seq_len in BATCH], dtype=index_dtype)
    starts = [0]
    for q_len, _ in BATCH:
        starts.append(starts[-1] + q_len)
    return block_tables, seq_lens, torch.tensor(starts, dtype=index_dtype), num_blocks


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _cache(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (_randn(*shape, seed=seed) * (4.0 if dtype in FP8_DTYPES else 1.0)).to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_paged_attention_matches_reference(assert_matches_reference, dtype, index_dtype):
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(index_dtype)
    tokens = int(query_start_loc[-1]) + 2  # two padding rows past the last sequence
    query = _randn(tokens, 4, 16).to(dtype)
    key_cache = _cache((num_blocks, BLOCK_SIZE, 2, 16), dtype, seed=1)
    value_cache = _cache((num_blocks, BLOCK_SIZE, 2, 16), dtype, seed=2)
    assert_matches_reference(
        "paged_attention", query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale=0.25
    )


def test_paged_attention_honours_the_sliding_window(assert_matches_reference):
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(torch.int32)
    query = _randn(int(query_start_loc[-1]), 4, 16)
    key_cache, value_cache = _randn(num_blocks, BLOCK_SIZE, 2, 16, seed=1), _randn(num_blocks, BLOCK_SIZE, 2, 16, seed=2)
    assert_matches_reference(
        "paged_attention", query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        scale=0.25, sliding_window=5,
    )


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
def test_paged_attention_reads_fp8_pages_times_their_scales(assert_matches_reference, fp8_dtype):
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(torch.int64)
    query = _randn(int(query_start_loc[-1]), 4, 16).to(torch.float16)
    key_cache = _cache((num_blocks, BLOCK_SIZE, 2, 16), fp8_dtype, seed=1)
    value_cache = _cache((num_blocks, BLOCK_SIZE, 2, 16), fp8_dtype, seed=2)
    assert_matches_reference(
        "paged_attention", query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        scale=0.25, k_scale=0.5, v_scale=0.25,
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_mla_attention_matches_reference(assert_matches_reference, dtype, index_dtype):
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(index_dtype)
    tokens = int(query_start_loc[-1])
    q_latent, q_pe = _randn(tokens, 2, 32).to(dtype), _randn(tokens, 2, 16, seed=1).to(dtype)
    kv_cache = _cache((num_blocks, BLOCK_SIZE, 48), dtype, seed=2)
    assert_matches_reference(
        "mla_attention", q_latent, q_pe, kv_cache, block_tables, seq_lens, query_start_loc, scale=0.15
    )


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
def test_mla_attention_reads_an_fp8_latent_cache_times_its_scale(assert_matches_reference, fp8_dtype):
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(torch.int32)
    tokens = int(query_start_loc[-1])
    q_latent, q_pe = _randn(tokens, 2, 32).to(torch.bfloat16), _randn(tokens, 2, 16, seed=1).to(torch.bfloat16)
    kv_cache = _cache((num_blocks, BLOCK_SIZE, 48), fp8_dtype, seed=2)
    assert_matches_reference(
        "mla_attention", q_latent, q_pe, kv_cache, block_tables, seq_lens, query_start_loc,
        scale=0.15, kv_scale=0.25,
    )


def test_paged_attention_tiles_a_gqa_group_that_is_not_a_power_of_two(assert_matches_reference):
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(torch.int64)
    query = _randn(int(query_start_loc[-1]), 6, 16).to(torch.float16)
    key_cache = _cache((num_blocks, BLOCK_SIZE, 2, 16), torch.float16, seed=1)
    value_cache = _cache((num_blocks, BLOCK_SIZE, 2, 16), torch.float16, seed=2)
    assert_matches_reference(
        "paged_attention", query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale=0.25
    )


def test_mla_attention_spreads_more_heads_than_one_tile_holds_over_tiles(assert_matches_reference):
    block_tables, seq_lens, query_start_loc, num_blocks = _metadata(torch.int32)
    tokens = int(query_start_loc[-1])
    q_latent, q_pe = _randn(tokens, 20, 32).to(torch.float16), _randn(tokens, 20, 16, seed=1).to(torch.float16)
    kv_cache = _cache((num_blocks, BLOCK_SIZE, 48), torch.float16, seed=2)
    assert_matches_reference(
        "mla_attention", q_latent, q_pe, kv_cache, block_tables, seq_lens, query_start_loc, scale=0.15
    )
