"""Arguments of paged_attention calls shaped as the engine sends them, for the cpu
attention tests: block tables pointing at shuffled physical blocks (padded with -1),
NaN in every cache slot no sequence owns, padding query rows past the last sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from accord.backends.cpu.kernels._native_attention import Isa

BLOCK_SIZE = 4
#: (cached length, new query rows): a whole prefill, a decode, a chunk of a longer
#: prefill, a decode with a much longer context, a one-token sequence.
MIXED = ((6, 6), (9, 1), (11, 4), (37, 1), (1, 1))
PADDING_ROWS = 2


def _cpu_has_avx512_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return "avx512_bf16" in cpuinfo.read()
    except OSError:
        return False


def forced_isa(isa: Isa, kernel: str, built: bool) -> Isa:
    """`isa` for a test that forces a C attention kernel's path, or a skip with the
    reason: the kernel (named for the message) is not `built`, or the path is
    AVX512-BF16 and this CPU itself lacks it (the kernel checks the same, and the
    simulated CPUs of ACCORD_TEST_CPU cannot lend it: it would run fp32 lanes instead)."""
    if not built:
        pytest.skip(f"no C compiler on this host: the C {kernel} kernel cannot be built")
    if isa is Isa.AVX512_BF16 and not _cpu_has_avx512_bf16():
        pytest.skip("this CPU has no AVX512-BF16: the kernel would run its fp32 path instead")
    return isa


def metadata(lengths: tuple[tuple[int, int], ...], index_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
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


def poisoned_cache(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, entry: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """A cache with random values in every position a sequence owns and NaN elsewhere."""
    cache = torch.full((num_blocks, BLOCK_SIZE, *entry), float("nan"))
    for b, seq_len in enumerate(seq_lens.tolist()):
        positions = torch.arange(seq_len)
        slots = block_tables[b, positions // BLOCK_SIZE].long() * BLOCK_SIZE + positions % BLOCK_SIZE
        cache.view(-1, *entry)[slots] = torch.randn(seq_len, *entry)
    return cache.to(dtype)


def paged_call(
    lengths: tuple[tuple[int, int], ...],
    index_dtype: torch.dtype = torch.int32,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    q_heads: int = 8,
    kv_heads: int = 2,
    head_dim: int = 16,
) -> tuple[torch.Tensor, ...]:
    """Arguments of a paged_attention call over `lengths`, with padding query rows."""
    block_tables, seq_lens, query_start_loc, num_blocks = metadata(lengths, index_dtype)
    entry, stored = (kv_heads, head_dim), cache_dtype or dtype
    key_cache, value_cache = (poisoned_cache(block_tables, seq_lens, num_blocks, entry, stored) for _ in range(2))
    query = torch.randn(int(query_start_loc[-1]) + PADDING_ROWS, q_heads, head_dim).to(dtype)
    return query, key_cache, value_cache, block_tables, seq_lens, query_start_loc
