"""The glue kernels of elementwise.c (RMS norm with or without the residual add, rotary
embedding, SiLU-and-mul, the KV cache write, and the embedding gather the cpu graph
lowers an embedding lookup to), one ctypes call each, built and loaded by `_native`.

Each function returns False, having written nothing, where the C path does not apply
(no C compiler, a dtype it lacks, a position or slot out of range, sizes that do not
agree) and the caller runs its torch path, which raises what torch raises; True once
the outputs are written. Tensors are contiguous (the contracts say so for inputs, and
the dispatcher allocates outputs so). Sizes are checked here although the contracts
say them too: a dispatcher's fast path validates a signature's first call only, and a
C kernel given a wrong size reads or writes out of bounds instead of raising."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from . import _native

#: The dtypes the C kernels compute (code as elementwise.c numbers them); half types
#: other than bf16 keep the torch path.
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
#: Elements from which a call splits its rows over torch's threads: below, waking the
#: OpenMP team costs more than the rows (a decode step's few rows run on one thread).
PARALLEL_ELEMENTS = 1 << 16

_P, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float


#: The entry points of elementwise.c.
SIGNATURES = (
    ("accord_rms_norm", None, (_P,) * 5 + (_L, _L, _F, _I, _I)),
    ("accord_rotary_embedding", _I, (_P, _I) + (_P,) * 5 + (_L,) * 6 + (_I, _I, _I)),
    ("accord_silu_and_mul", None, (_P, _P, _L, _L, _I, _I)),
    ("accord_reshape_and_cache", _I, (_P,) * 5 + (_I, _L, _L, _L)),
    ("accord_embedding", _I, (_P, _P, _I, _P, _L, _L, _L)),
    ("accord_copy_rows", None, (_P, _P, _L, _L, _L)),
)
#: What `_native.load` builds and loads (and `_native.build_ahead` starts building): at
#: -O2, with the arithmetic loops vectorised by `omp simd` (elementwise.c's SIMD_LOOP),
#: its ops ran as fast as the -O3 build's (decode and 2048-row prefill shapes, the two
#: alternating in one process); with each row loop compiled once (FOR_ROW_RANGES) it
#: builds in 0.4x the CPU time (1.3 vs 3.2 s), part of a cold start-up.
LIBRARY = ("elementwise.c", SIGNATURES, "-O2")


@cache  # the kernels call this per op: one lookup, not a hash of the signatures
def _library() -> _native.NativeLibrary | None:
    """The built library with its entry points typed; None where it cannot be built."""
    return _native.load(*LIBRARY)


def _threads(elements: int) -> int:
    return torch.get_num_threads() if elements >= PARALLEL_ELEMENTS else 1


def rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, out: torch.Tensor,
    residual_out: torch.Tensor | None,
) -> bool:
    """out = rms_norm(x) (residual None), or residual_out = x + residual and out =
    rms_norm(residual_out), as the contracts define them."""
    code = _DTYPE_CODES.get(x.dtype)
    library = _library()
    if code is None or library is None:
        return False
    rows, hidden = x.shape
    if weight.shape[0] != hidden or (residual is not None and residual.shape != x.shape):
        return False
    library.accord_rms_norm(
        x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(), out.data_ptr(),
        None if residual_out is None else residual_out.data_ptr(), rows, hidden, eps, code, _threads(x.numel()),
    )
    return True


def rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool,
    query_out: torch.Tensor, key_out: torch.Tensor,
) -> bool:
    """The rotary_embedding contract, the table row of each position looked up in C."""
    code = _DTYPE_CODES.get(query.dtype)
    library = _library()
    if code is None or library is None:
        return False
    tokens, query_heads, head_dim = query.shape
    max_positions, rotary_dim = cos_sin_cache.shape
    key_tokens, key_heads, key_dim = key.shape
    if (key_tokens, key_dim, positions.shape[0]) != (tokens, head_dim, tokens) or rotary_dim > head_dim:
        return False
    done = library.accord_rotary_embedding(
        positions.data_ptr(), positions.dtype == torch.int64, query.data_ptr(), key.data_ptr(),
        cos_sin_cache.data_ptr(), query_out.data_ptr(), key_out.data_ptr(), tokens, query_heads, key_heads,
        head_dim, rotary_dim, max_positions, is_neox, code, _threads(query.numel()),
    )
    return done == 0


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> bool:
    """out = silu(x[:, :I]) * x[:, I:]."""
    code = _DTYPE_CODES.get(x.dtype)
    library = _library()
    if code is None or library is None:
        return False
    rows, intermediate = out.shape
    if x.shape[1] != 2 * intermediate:
        return False
    library.accord_silu_and_mul(x.data_ptr(), out.data_ptr(), rows, intermediate, code, _threads(x.numel()))
    return True


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> bool:
    """Copy key/value rows into their cache slots (negative slots skipped); only for a
    cache of the inputs' own dtype (an fp8 cache keeps the torch path)."""
    library = _library()
    if library is None or key_cache.dtype != key.dtype:
        return False
    shape, cache_shape = key.shape, key_cache.shape
    if value.shape != shape or value_cache.shape != cache_shape or cache_shape[2:] != shape[1:]:
        return False
    tokens, heads, head_dim = shape
    if slot_mapping.shape[0] != tokens:
        return False
    done = library.accord_reshape_and_cache(
        key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), slot_mapping.data_ptr(),
        slot_mapping.dtype == torch.int64, tokens, heads * head_dim * key.element_size(),
        cache_shape[0] * cache_shape[1],
    )
    return done == 0


def embedding(table: torch.Tensor, ids: torch.Tensor, out: torch.Tensor) -> bool:
    """out [T, H] = the rows of table [V, H] that ids [T] (int32 or int64) name, when
    every id is in range (the cpu graph's replay of an embedding lookup)."""
    library = _library()
    if (
        library is None or ids.dtype not in (torch.int32, torch.int64) or out.dtype != table.dtype
        or not (table.is_contiguous() and ids.is_contiguous() and out.is_contiguous())
        or out.shape != (ids.shape[0], table.shape[1])
    ):
        return False
    done = library.accord_embedding(
        table.data_ptr(), ids.data_ptr(), ids.dtype == torch.int64, out.data_ptr(), ids.shape[0],
        table.shape[1] * table.element_size(), table.shape[0],
    )
    return done == 0


def copy_rows(src: torch.Tensor, out: torch.Tensor) -> bool:
    """out = src made contiguous, where src is a view whose rows (its first dimension)
    are each contiguous, some stride apart (the cpu graph's replay of `.contiguous()` on
    a slice of a wider tensor's columns)."""
    library = _library()
    if library is None or src.dim() == 0 or out.dtype != src.dtype or out.shape != src.shape or not out.is_contiguous():
        return False
    row = src[0] if src.shape[0] else src
    if not row.is_contiguous() or (src.dim() > 1 and src.shape[0] > 1 and src.stride(0) < row.numel()):
        return False
    row_bytes = row.numel() * src.element_size()
    library.accord_copy_rows(src.data_ptr(), out.data_ptr(), src.shape[0], row_bytes, src.stride(0) * src.element_size())
    return True
