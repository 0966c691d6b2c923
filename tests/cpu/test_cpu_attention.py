"""cpu paged_attention and mla_attention against the reference on the shapes the
engine sends: one call mixing whole prefills, later prefill chunks and decodes, block
tables pointing at shuffled physical blocks (padded with -1), NaN in every cache slot
no sequence owns, and padding query rows past the last sequence. Every test runs twice:
with decode rows in the C kernel, and on the torch path a host without a C compiler
takes."""

from __future__ import annotations

import pytest
import torch
from paged_calls import MIXED, PADDING_ROWS, metadata, paged_call, poisoned_cache

from accord.backends.cpu.kernels import _native_attention


@pytest.fixture(autouse=True, params=["c", "torch"])
def decode_kernel(request, monkeypatch) -> str:
    """Which decode-attention path the test runs on ("torch": the C library unbuildable)."""
    if request.param == "torch":
        monkeypatch.setattr(_native_attention, "_library", lambda: None)
    elif _native_attention._library() is None:
        pytest.skip("no C compiler on this host: the C decode-attention kernel cannot be built")
    return request.param


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_prefill_and_decode_batch_matches_reference(assert_matches_reference, index_dtype, dtype) -> None:
    assert_matches_reference("paged_attention", *paged_call(MIXED, index_dtype, dtype), scale=0.25)


def test_sliding_window_matches_reference(assert_matches_reference) -> None:
    assert_matches_reference("paged_attention", *paged_call(MIXED), scale=0.25, sliding_window=5)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_fp8_cache_is_read_times_its_scales(assert_matches_reference, fp8) -> None:
    call = paged_call(MIXED, dtype=torch.bfloat16, cache_dtype=fp8)
    assert_matches_reference("paged_attention", *call, scale=0.25, k_scale=0.5, v_scale=2.0)


def test_decodes_of_very_different_lengths_match_reference(assert_matches_reference) -> None:
    lengths = tuple((n, 1) for n in (1, 3, 60, 7, 33, 2, 64, 17))
    assert_matches_reference("paged_attention", *paged_call(lengths), scale=0.25)


def test_a_query_head_per_kv_head_matches_reference(assert_matches_reference) -> None:
    assert_matches_reference("paged_attention", *paged_call(MIXED, q_heads=4, kv_heads=4), scale=0.25)


def test_rows_no_sequence_owns_are_zero(cpu_ops) -> None:
    out = cpu_ops.paged_attention(*paged_call(MIXED), scale=0.25)
    assert torch.equal(out[-PADDING_ROWS:], torch.zeros_like(out[-PADDING_ROWS:]))


def test_a_small_call_after_a_large_one_matches_reference(cpu_ops, assert_matches_reference) -> None:
    """The kernels gather into reused scratch buffers; a smaller call must only see its
    own part of them."""
    cpu_ops.paged_attention(*paged_call(tuple((64, 1) for _ in range(8))), scale=0.25)
    assert_matches_reference("paged_attention", *paged_call(((5, 1), (3, 3))), scale=0.25)


def test_metadata_refilled_in_place_is_not_served_a_stale_plan(cpu_ops, reference_ops, nmse_of) -> None:
    """Each step's plan (layout, decode batch indices) is reused across layers; the
    same metadata tensors refilled in place with another step's values, or met with
    another sliding window, must get plans of their own."""
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc = paged_call(
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
@pytest.mark.parametrize("latent, rope", [(32, 8), (64, 32)])
def test_mla_mixed_batch_matches_reference(assert_matches_reference, index_dtype, cache_dtype, latent, rope) -> None:
    """Latent widths off (40 channels) and on (96 and 64) the C kernel's chunks."""
    heads = 4
    block_tables, seq_lens, query_start_loc, num_blocks = metadata(MIXED, index_dtype)
    kv_cache = poisoned_cache(block_tables, seq_lens, num_blocks, (latent + rope,), cache_dtype)
    rows = int(query_start_loc[-1]) + PADDING_ROWS
    q_latent, q_pe = torch.randn(rows, heads, latent), torch.randn(rows, heads, rope)
    assert_matches_reference(
        "mla_attention", q_latent, q_pe, kv_cache, block_tables, seq_lens, query_start_loc, scale=0.2, kv_scale=0.5
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_c_kernel_takes_decodes_and_leaves_prefills_to_the_torch_path(decode_kernel, dtype) -> None:
    """It attends every single-row sequence and reports the rest; the tests above then
    check its numbers. (On the torch path nothing is taken.)"""
    decodes = paged_call(tuple((n, 1) for n in (9, 40)), dtype=dtype)
    mixed = paged_call(MIXED, dtype=dtype)
    taken = [
        _native_attention.attend_decodes(*call, scale=0.25, sliding_window=0, out=torch.empty_like(call[0]))
        for call in (decodes, mixed)
    ]
    assert taken == ([0, 2] if decode_kernel == "c" else [None, None])


def test_metadata_outside_the_cache_is_left_to_the_checked_path(decode_kernel) -> None:
    """A block id past the cache: the C kernel writes nothing and declines the call."""
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc = paged_call(((9, 1),))
    block_tables[0, 1] = key_cache.shape[0]
    out = torch.full_like(query, 7.0)
    taken = _native_attention.attend_decodes(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale=0.25, sliding_window=0, out=out
    )
    assert taken is None
    assert torch.equal(out, torch.full_like(query, 7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_a_decode_gets_the_same_bits_alone_as_beside_a_prefill_and_many_decodes(
    cpu_ops, dtype, threads, head_dim
) -> None:
    """Batch invariance: sequence 1 (a decode of 300 positions) alone and inside a step
    with a prefill chunk and 40 long decodes, enough work for the kernel's threads; on
    the C kernel's generic path (16 channels) and its chunked one (64)."""
    lengths = ((11, 4), (300, 1), *((250 + n, 1) for n in range(40)))
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc = paged_call(
        lengths, dtype=dtype, head_dim=head_dim
    )
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = cpu_ops.paged_attention(
            query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale=0.25
        )
        row = int(query_start_loc[1])
        alone = cpu_ops.paged_attention(
            query[row : row + 1], key_cache, value_cache, block_tables[1:2], seq_lens[1:2],
            torch.tensor([0, 1], dtype=query_start_loc.dtype), scale=0.25,
        )
    finally:
        torch.set_num_threads(threads_before)
    assert torch.equal(together[row : row + 1].view(torch.uint8), alone.view(torch.uint8))  # bit for bit


#: Runs of like prefill chunks (attended in one SDPA call per run) between other kinds:
#: three whole prompts, a decode, two chunks with cached context, a lone whole prompt,
#: two more whole prompts of another length.
LIKE_RUNS = ((6, 6), (6, 6), (6, 6), (9, 1), (11, 4), (11, 4), (6, 6), (5, 5), (5, 5))


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_runs_of_like_prefills_match_reference(assert_matches_reference, window, dtype) -> None:
    assert_matches_reference("paged_attention", *paged_call(LIKE_RUNS, dtype=dtype), scale=0.25, sliding_window=window)


@pytest.mark.parametrize("lengths", [((16, 16),) * 6 + ((9, 1),), ((20, 4),) * 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prefill_gets_the_same_bits_alone_as_in_a_run_of_like_prefills(cpu_ops, lengths, dtype) -> None:
    """Batch invariance: sequence 2 alone, and in the middle of a run of chunks of its
    shape (one SDPA call for the run)."""
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc = paged_call(lengths, dtype=dtype)
    together = cpu_ops.paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, scale=0.25)
    first, last = int(query_start_loc[2]), int(query_start_loc[3])
    alone = cpu_ops.paged_attention(
        query[first:last], key_cache, value_cache, block_tables[2:3], seq_lens[2:3],
        torch.tensor([0, last - first], dtype=query_start_loc.dtype), scale=0.25,
    )
    assert torch.equal(together[first:last].view(torch.uint8), alone.view(torch.uint8))  # bit for bit


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_long_decodes_under_a_sliding_window_match_reference(assert_matches_reference, cache_dtype) -> None:
    """Windows that start inside a block, over contexts of many blocks."""
    lengths = tuple((n, 1) for n in (200, 97, 13, 64))
    call = paged_call(lengths, dtype=cache_dtype, q_heads=8, kv_heads=2, head_dim=64)
    for window in (0, 1, 37, 100):
        assert_matches_reference("paged_attention", *call, scale=0.125, sliding_window=window)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
@pytest.mark.parametrize("q_heads, kv_heads", [(2, 2), (4, 2), (6, 2), (12, 3), (14, 2)])
def test_head_sizes_and_groups_of_the_chunked_path_match_reference(
    assert_matches_reference, cache_dtype, head_dim, q_heads, kv_heads
) -> None:
    """Head sizes that are whole chunks of 32 channels (one, the unrolled 64, two and a
    half-block of values, four) and groups of 1, 2, 3, 4 and 7 queries per kv head (the
    kernel takes them four, two and one at a time), with contexts off and on its tile of
    16 positions."""
    call = paged_call(MIXED + ((16, 1), (150, 1)), dtype=cache_dtype, q_heads=q_heads, kv_heads=kv_heads,
                       head_dim=head_dim)
    assert_matches_reference("paged_attention", *call, scale=head_dim**-0.5)


def test_a_head_size_off_the_vector_width_matches_reference(assert_matches_reference) -> None:
    """24 channels: one vector of 16 and a scalar tail in every dot and value sum."""
    call = paged_call(MIXED + ((150, 1),), q_heads=6, kv_heads=3, head_dim=24)
    assert_matches_reference("paged_attention", *call, scale=0.3)


def test_a_query_viewed_out_of_a_fused_qkv_row_matches_reference(assert_matches_reference) -> None:
    """The model hands the query as a view of the fused QKV projection (rows longer
    than its heads)."""
    query, *rest = paged_call(MIXED)
    rows, heads, dim = query.shape
    fused = torch.randn(rows, heads * dim + 2 * 2 * dim)
    fused[:, : heads * dim] = query.flatten(1)
    assert_matches_reference("paged_attention", fused[:, : heads * dim].view(rows, heads, dim), *rest, scale=0.25)


def test_scores_far_below_the_maximum_get_no_weight(assert_matches_reference) -> None:
    """A large softmax scale: most positions sit hundreds below the maximum, where
    e^x underflows (the C kernel's exp clamps there)."""
    assert_matches_reference("paged_attention", *paged_call(tuple((n, 1) for n in (90, 33))), scale=40.0)
