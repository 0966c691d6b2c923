"""Paged attention in C, built and loaded by `_native`: the decode rows
(paged_decode_attention.c) and the prefill rows (paged_prefill_attention.c). Both read
the paged caches in place through the block table, with no gather and no per-step index
tensors, each sequence computed alone (batch invariant), and take one argument struct."""

from __future__ import annotations

import ctypes
import enum
import struct
from functools import cache

import torch

from .. import capability
from . import _native

#: The C kernel's dtype codes of the query, output and cache tensors it reads natively.
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
#: The metadata index dtypes it reads, by their width in bytes.
INDEX_BYTES = {torch.int32: 4, torch.int64: 8}
#: The one argument struct of both C files, declared here only (the build writes its C
#: definition): the call's tensors and sizes, in the order `_pack_call` packs them.
PAGED_CALL = _native.Int64Struct("paged_call", (
    "query", "q_dtype", "out", "out_dtype", "rows", "q_row_stride", "q_head_stride", "out_row_stride",
    "out_head_stride", "q_heads",
    "key_cache", "value_cache", "kv_dtype", "num_blocks", "block_size", "block_stride", "slot_stride",
    "head_stride", "kv_heads", "key_dim", "value_dim",
    "block_tables", "table_stride", "table_width", "seq_lens", "query_start_loc", "num_seqs", "index_bytes",
    "sliding_window", "threads",
))
#: Its `struct` format, taken once (a decode step packs it per attention call).
CALL_LAYOUT = PAGED_CALL.layout
#: What `_native.load` builds and loads (and `_native.build_ahead` starts building): the
#: decode kernel and the prefill kernel (each also takes its path, `Isa`).
LIBRARY = (
    "paged_decode_attention.c",
    (("accord_paged_decode_attention", ctypes.c_long, (ctypes.c_void_p, ctypes.c_float, ctypes.c_long)),),
    _native.DEFAULT_OPTIMIZATION,
    (PAGED_CALL,),
)
PREFILL_LIBRARY = (
    "paged_prefill_attention.c",
    (("accord_paged_prefill_attention", ctypes.c_long, (ctypes.c_void_p, ctypes.c_float, ctypes.c_long)),),
    _native.DEFAULT_OPTIMIZATION,
    (PAGED_CALL,),
)


class Isa(enum.IntEnum):
    """How the kernels compute their products (`enum isa`, paged_attention_bf16.h): the
    prefill kernel its query . key products, the decode kernel its query . key and
    weight . value products."""

    FP32 = 0  #: fp32 lanes, bf16 widened exactly (AVX512F or AVX2 code, as the host builds it)
    #: vdpbf16ps on bf16 pairs (bf16 query and cache; the kernel checks the CPU has it).
    #: The decode kernel also rounds the softmax weights to bf16 for the values.
    AVX512_BF16 = 1


def prefill_isa() -> Isa:
    """The paged kernels' path on this host (decode and prefill): AVX512-BF16 where the
    cpu backend computes bf16 natively (`ACCORD_CPU_BF16_PATH` forces either answer),
    else fp32 lanes."""
    return Isa.AVX512_BF16 if capability.cpu_has_native_bf16() else Isa.FP32


@cache  # the kernels call this per op: one lookup, not a hash of the signatures
def _library() -> _native.NativeLibrary | None:
    """The built decode library with its entry point typed; None where it cannot be built."""
    return _native.load(*LIBRARY)


@cache
def _prefill_library() -> _native.NativeLibrary | None:
    """The built prefill library with its entry point typed; None where it cannot be built."""
    return _native.load(*PREFILL_LIBRARY)


def _pack_call(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    sliding_window: int,
    out: torch.Tensor,
) -> bytes | None:
    """struct paged_call for these tensors, in PAGED_CALL's field order, as an immutable
    bytes object (a graph capture, `_native_graph`, keeps it as the memory the recorded
    pointer points into); None where the C kernels do not take them (dtypes other than
    fp32/bf16, channels not contiguous, index dtypes that differ)."""
    # Each tensor's properties are read once: on a slow host every attribute costs
    # about half a microsecond, as much as the whole ctypes call at batch 1.
    q_code, out_code, kv_code = (DTYPE_CODES.get(t.dtype) for t in (query, out, key_cache))
    q_strides, out_strides, kv_strides = query.stride(), out.stride(), key_cache.stride()
    (rows, q_heads, key_dim), value_dim = query.shape, out.shape[2]
    num_blocks, block_size, kv_heads, cache_dim = key_cache.shape
    index = block_tables.dtype
    if (
        q_code is None or out_code is None or kv_code is None or value_cache.dtype != key_cache.dtype
        or value_cache.stride() != kv_strides or q_strides[2] != 1 or out_strides[2] != 1 or kv_strides[3] != 1
        or key_dim > cache_dim or value_dim > value_cache.shape[3]
        or index not in INDEX_BYTES or seq_lens.dtype != index or query_start_loc.dtype != index
        or block_tables.stride(1) != 1 or seq_lens.stride(0) != 1 or query_start_loc.stride(0) != 1
    ):
        return None
    return struct.pack(CALL_LAYOUT, *(
        query.data_ptr(), q_code, out.data_ptr(), out_code, rows, q_strides[0], q_strides[1],
        out_strides[0], out_strides[1], q_heads,
        key_cache.data_ptr(), value_cache.data_ptr(), kv_code,
        num_blocks, block_size, kv_strides[0], kv_strides[1], kv_strides[2], kv_heads, key_dim, value_dim,
        block_tables.data_ptr(), block_tables.stride(0), block_tables.shape[1],
        seq_lens.data_ptr(), query_start_loc.data_ptr(), seq_lens.shape[0], INDEX_BYTES[index],
        sliding_window, torch.get_num_threads(),
    ))


def attend_decodes(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int,
    out: torch.Tensor,
    isa: Isa | None = None,
) -> int | None:
    """Attend every single-row sequence of the step in place and zero the rows no
    sequence owns. query is [T, Hq, Dk], out [T, Hq, Dv], the caches [NB, BS, Hk, D]
    with keys the first Dk channels of key_cache and values the first Dv of value_cache
    (one tensor for both in MLA's latent cache). Returns how many sequences with more
    query rows are left to the caller, or None when the C kernel does not take this
    call (dtypes other than fp32/bf16, channels not contiguous, no compiler, metadata
    pointing outside the caches, no memory for its scratch): then the caller's torch
    path does the whole call (and reports bad metadata). `isa` forces the path (default:
    `prefill_isa()`); AVX512_BF16 runs only for a bf16 query and cache with key and value
    widths that are multiples of 32 on a CPU with the instruction, else fp32 lanes do."""
    library = _library()
    call = None if library is None else _pack_call(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, sliding_window, out
    )
    if call is None:
        return None
    left = library.accord_paged_decode_attention(call, scale, prefill_isa() if isa is None else isa)
    return None if left < 0 else left


def attend_prefills(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int,
    out: torch.Tensor,
    isa: Isa | None = None,
) -> bool:
    """Attend every sequence of the step with more than one query row, in place, after
    `attend_decodes` has taken the call (same tensors as there): the cached prefix of a
    chunk is read by the same kernel. `isa` forces the query . key path (default:
    `prefill_isa()`). Returns whether the C kernel did it; False where it does not take
    the call (as for `attend_decodes`), and then the caller's torch path attends the
    prefills (and reports bad metadata)."""
    library = _prefill_library()
    call = None if library is None else _pack_call(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, sliding_window, out
    )
    if call is None:
        return False
    return library.accord_paged_prefill_attention(call, scale, prefill_isa() if isa is None else isa) == 0
