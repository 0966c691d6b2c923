"""The C prefill-attention kernel (paged_prefill_attention.c) against the reference
backend's paged_attention (fp64), called directly so that a fallback to the torch path
cannot pass for it: GQA, whole prompts longer than one task's query tile, chunks after a
cached prefix, decodes between them, shuffled block tables, NaN in every slot no
sequence owns; on each query . key path, forced whatever the host would pick."""

from __future__ import annotations

import pytest
import torch
from paged_calls import forced_isa, paged_call

from accord.backends.cpu import capability
from accord.backends.cpu.kernels import _native_attention
from accord.backends.cpu.kernels._native_attention import Isa
from accord.op_contracts import CONTRACTS


@pytest.fixture(params=list(Isa), ids=lambda isa: isa.name)
def isa(request: pytest.FixtureRequest) -> Isa:
    """The query . key path the kernel is told to take."""
    return forced_isa(request.param, "prefill-attention", _native_attention._prefill_library() is not None)


#: (cached length, new query rows): a whole prompt of two query tiles (32 positions per
#: task at a group of 4), a decode, a chunk after a cached prefix of 70, a short prompt,
#: a chunk of two rows, a decode of a long context.
LENGTHS = ((45, 45), (9, 1), (93, 23), (6, 6), (40, 2), (120, 1))


def _attend(call: tuple[torch.Tensor, ...], scale: float, window: int, isa: Isa) -> torch.Tensor:
    """The decode kernel, then the prefill kernel, both on `isa`; both must take the call."""
    out = torch.full_like(call[0], float("nan"))
    assert _native_attention.attend_decodes(*call, scale=scale, sliding_window=window, out=out, isa=isa) is not None
    assert _native_attention.attend_prefills(*call, scale=scale, sliding_window=window, out=out, isa=isa)
    return out


def _assert_matches_reference(reference_ops, call, got, scale: float, window: int) -> None:
    want = reference_ops.paged_attention(*call, scale=scale, sliding_window=window)
    dtypes = {"query": call[0].dtype, "key_cache": call[1].dtype, "value_cache": call[2].dtype, "out": got.dtype}
    bound = CONTRACTS["paged_attention"].tolerance_for(dtypes)
    assert not got.isnan().any()
    nmse = float(((got.double() - want.double()) ** 2).sum() / (want.double() ** 2).sum())
    assert nmse <= bound, f"nmse {nmse:.3g} > {bound:.3g}"


@pytest.mark.parametrize("window", [0, 19])
@pytest.mark.parametrize("head_dim", [24, 64])
def test_prefills_and_chunks_after_a_cached_prefix_match_reference(reference_ops, isa, head_dim, window) -> None:
    """24 channels: vector and scalar tails in every sum; a window of 19 starts inside
    a key tile and hides part of the cached prefix."""
    call = paged_call(LENGTHS, dtype=torch.bfloat16, q_heads=8, kv_heads=2, head_dim=head_dim)
    got = _attend(call, head_dim**-0.5, window, isa)
    _assert_matches_reference(reference_ops, call, got, head_dim**-0.5, window)


def test_fp32_tensors_match_reference_to_fp32_rounding(reference_ops, isa) -> None:
    """fp32 query and cache (the fp32 path whichever path is asked): close to fp64."""
    call = paged_call(LENGTHS, dtype=torch.float32, q_heads=6, kv_heads=3, head_dim=32)
    got = _attend(call, 0.2, 0, isa)
    want = reference_ops.paged_attention(*call, scale=0.2)
    assert float(((got.double() - want) ** 2).sum() / (want**2).sum()) < 1e-11


def test_one_query_head_per_kv_head_and_large_scores_match_reference(reference_ops, isa) -> None:
    """No grouping, and a scale that puts most scores hundreds below the row maximum
    (where the kernel's exp clamps: hidden and far positions must weigh 0)."""
    call = paged_call(LENGTHS, dtype=torch.bfloat16, q_heads=4, kv_heads=4, head_dim=32)
    got = _attend(call, 30.0, 0, isa)
    _assert_matches_reference(reference_ops, call, got, 30.0, 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_chunk_gets_the_same_bits_alone_as_in_a_full_step(isa, threads) -> None:
    """Batch invariance: sequence 1 (a chunk after 30 cached positions) alone, and
    among whole prompts and decodes with enough work for the kernel's threads."""
    lengths = ((64, 64), (75, 45), *((64, 64),) * 5, (90, 1))
    call = paged_call(lengths, dtype=torch.bfloat16, q_heads=8, kv_heads=2, head_dim=64)
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc = call
    first, last = int(query_start_loc[1]), int(query_start_loc[2])
    alone = (query[first:last], key_cache, value_cache, block_tables[1:2], seq_lens[1:2],
             torch.tensor([0, last - first], dtype=query_start_loc.dtype))
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together, single = _attend(call, 0.125, 0, isa), _attend(alone, 0.125, 0, isa)
    finally:
        torch.set_num_threads(threads_before)
    assert torch.equal(together[first:last].view(torch.uint8), single.view(torch.uint8))  # bit for bit


def test_the_dispatched_op_takes_the_host_path_and_matches_reference(assert_matches_reference) -> None:
    """Through the cpu backend's dispatcher, on whichever path this host picks."""
    assert_matches_reference("paged_attention", *paged_call(LENGTHS, dtype=torch.bfloat16), scale=0.25)


def test_the_host_path_follows_the_bf16_forcing(forced_fp32_bf16) -> None:
    assert _native_attention.prefill_isa() is Isa.FP32
    assert capability.cpu_has_native_bf16() is False


def test_a_block_id_outside_the_cache_is_left_to_the_checked_path(isa) -> None:
    """A prefill's table points past the cache: the kernel declines and writes nothing."""
    call = paged_call(((9, 1), (12, 8)), dtype=torch.bfloat16)
    query, key_cache, *_ = call
    call[3][1, 1] = key_cache.shape[0]
    out = torch.full_like(query, 7.0)
    assert not _native_attention.attend_prefills(*call, scale=0.25, sliding_window=0, out=out, isa=isa)
    assert torch.equal(out, torch.full_like(query, 7.0))


def test_fp16_tensors_are_left_to_the_torch_path(isa) -> None:
    call = paged_call(((12, 8),), dtype=torch.float16)
    assert not _native_attention.attend_prefills(*call, scale=0.25, sliding_window=0, out=torch.empty_like(call[0]), isa=isa)
