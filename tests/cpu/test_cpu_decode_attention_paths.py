"""The C decode-attention kernel (paged_decode_attention.c) on each of its paths, forced
whatever the host would pick: fp32 lanes and AVX512-BF16 (vdpbf16ps for query . key and
for the bf16-rounded weights . values). Called directly, so that a fallback to the
torch path cannot pass for it; checked against the reference backend (fp64) within the
paged_attention contract's bound, and for batch invariance bit for bit."""

from __future__ import annotations

import pytest
import torch
from paged_calls import forced_isa, paged_call

from accord.backends.cpu.kernels import _native_attention
from accord.backends.cpu.kernels._native_attention import Isa
from accord.op_contracts import CONTRACTS

pytestmark = pytest.mark.isa


@pytest.fixture(params=list(Isa), ids=lambda isa: isa.name)
def isa(request: pytest.FixtureRequest) -> Isa:
    """The path the decode kernel is told to take."""
    return forced_isa(request.param, "decode-attention", _native_attention._library() is not None)


#: Decodes only (cached length, 1): shorter than a tile, a tile and a half, ending on a
#: tile boundary, long.
DECODES = ((5, 1), (23, 1), (32, 1), (150, 1))


def _decode(call: tuple[torch.Tensor, ...], scale: float, window: int, isa: Isa) -> torch.Tensor:
    out = torch.full_like(call[0], float("nan"))
    assert _native_attention.attend_decodes(*call, scale=scale, sliding_window=window, out=out, isa=isa) == 0
    return out


def _nmse_bound(reference_ops, call, got, scale: float, window: int) -> tuple[float, float]:
    want = reference_ops.paged_attention(*call, scale=scale, sliding_window=window)
    dtypes = {"query": call[0].dtype, "key_cache": call[1].dtype, "value_cache": call[2].dtype, "out": got.dtype}
    nmse = float(((got.double() - want.double()) ** 2).sum() / (want.double() ** 2).sum())
    return nmse, CONTRACTS["paged_attention"].tolerance_for(dtypes)


@pytest.mark.parametrize("window", [0, 19])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("q_heads, kv_heads", [(2, 2), (8, 2), (12, 1), (20, 2)])
def test_bf16_decodes_match_reference(reference_ops, isa, head_dim, q_heads, kv_heads, window) -> None:
    """Groups of 1, 4, 12 (one tile of 8 queries and four of one) and 10; widths of one,
    two and four vectors of pairs; a window shorter than the long decodes."""
    call = paged_call(DECODES, dtype=torch.bfloat16, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim)
    got = _decode(call, 0.3, window, isa)
    nmse, bound = _nmse_bound(reference_ops, call, got, 0.3, window)
    assert not got[: len(DECODES)].isnan().any()
    assert nmse <= bound, f"nmse {nmse:.3g} > {bound:.3g}"


def test_large_scores_match_reference(reference_ops, isa) -> None:
    """Scores far apart: the online softmax's running maximum grows tile after tile."""
    call = paged_call(((70, 1), (40, 1)), dtype=torch.bfloat16, head_dim=64)
    got = _decode(call, 3.0, 0, isa)
    nmse, bound = _nmse_bound(reference_ops, call, got, 3.0, 0)
    assert nmse <= bound, f"nmse {nmse:.3g} > {bound:.3g}"


def test_widths_off_the_bf16_path_take_the_fp32_lanes(reference_ops, isa) -> None:
    """Head size 48 is no multiple of 32 and fp32 tensors are no bf16: the AVX512-BF16
    request falls back to the fp32 lanes, whose results it then gets bit for bit."""
    for call in (paged_call(DECODES, dtype=torch.bfloat16, head_dim=48), paged_call(DECODES, head_dim=64)):
        assert torch.equal(_decode(call, 0.3, 0, isa), _decode(call, 0.3, 0, Isa.FP32))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_decode_gets_the_same_bits_alone_as_among_many(isa, threads) -> None:
    """Batch invariance: sequence 0 alone, and beside 40 long decodes (enough work for the
    kernel's threads), gets the same bits."""
    lengths = ((300, 1), *((250 + n, 1) for n in range(40)))
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc = paged_call(
        lengths, dtype=torch.bfloat16, head_dim=64
    )
    alone = (query[:1], key_cache, value_cache, block_tables[:1], seq_lens[:1], query_start_loc[:2])
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together, single = _decode(tuple((query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)),
                                   0.25, 0, isa), _decode(alone, 0.25, 0, isa)
    finally:
        torch.set_num_threads(threads_before)
    assert torch.equal(together[0], single[0])


#: paged_decode_attention.c's PARTITION: a sequence with more visible positions is split
#: into partitions of this many, attended as tasks of their own and combined.
PARTITION = 1024
#: Split decodes: one position past a partition, three and a bit, exactly two; beside a
#: short one (unsplit).
SPLIT_DECODES = ((PARTITION + 1, 1), (3 * PARTITION + 37, 1), (7, 1), (2 * PARTITION, 1))


@pytest.mark.parametrize("window", [0, PARTITION + 45])
@pytest.mark.parametrize("head_dim", [24, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decodes_split_over_positions_match_reference(reference_ops, isa, dtype, head_dim, window) -> None:
    """Partitions combined in order, on the generic (24 channels) and the chunked or
    AVX512-BF16 (64) paths; a window longer than a partition, so that the windowed
    decodes split too, their partitions starting inside a block."""
    call = paged_call(SPLIT_DECODES, dtype=dtype, q_heads=6, kv_heads=3, head_dim=head_dim)
    got = _decode(call, 0.3, window, isa)
    nmse, bound = _nmse_bound(reference_ops, call, got, 0.3, window)
    assert not got[: len(SPLIT_DECODES)].isnan().any()
    assert nmse <= bound, f"nmse {nmse:.3g} > {bound:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_split_decode_gets_the_same_bits_on_one_and_two_threads_alone_and_among_others(isa, dtype) -> None:
    """Batch invariance of the split: sequence 0 (four partitions) alone on one thread,
    alone on two, and beside a short decode and two other split ones on one and on two
    threads, gets the same bits every time."""
    lengths = ((3 * PARTITION + 100, 1), (40, 1), (2 * PARTITION + 3, 1), (5 * PARTITION, 1))
    query, key_cache, value_cache, block_tables, seq_lens, query_start_loc = paged_call(
        lengths, dtype=dtype, q_heads=12, kv_heads=3, head_dim=64
    )
    together = (query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)
    alone = (query[:1], key_cache, value_cache, block_tables[:1], seq_lens[:1], query_start_loc[:2])
    threads_before = torch.get_num_threads()
    outputs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outputs += [_decode(alone, 0.25, 0, isa)[0], _decode(together, 0.25, 0, isa)[0]]
    finally:
        torch.set_num_threads(threads_before)
    assert all(torch.equal(out.view(torch.uint8), outputs[0].view(torch.uint8)) for out in outputs[1:])
