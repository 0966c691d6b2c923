"""The GGUF block kernels of gguf_quant_gemm.c (the int8 row dot and token-tile GEMM over
packed rows, the dequantisation of rows to fp32, and the embedding lookup), built and
loaded by `_native`."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from ....op_contracts import GGUF_FORMATS
from . import _native

_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int

#: The entry points of gguf_quant_gemm.c.
SIGNATURES = (
    ("accord_gguf_paths", _I, ()),
    ("accord_gguf_linear", _I, (_P, _P, _P, _P, _L, _L, _L, _I, _I, _I, _P, _I)),
    ("accord_gguf_dequantize", _I, (_P, _P, _L, _L, _L, _I, _I)),
    ("accord_gguf_embedding", _I, (_P, _P, _P, _L, _L, _L, _I, _I)),
)
LIBRARY = ("gguf_quant_gemm.c", SIGNATURES)
#: Format codes as gguf_quant_gemm.c numbers them (its enum, in GGUF_FORMATS' order).
FORMAT_CODES = {name: code for code, name in enumerate(GGUF_FORMATS)}
#: The dot paths, as the C code numbers them.
PATHS = {"plain": 0, "avx2": 1, "vnni": 2}
#: The kernels of one call, as gguf_quant_gemm.c numbers them (its `tiled` argument).
KERNELS = {"row dot": 0, "token tile": 1}
#: Most tokens one row-dot call takes (gguf_quant_gemm.c's MAX_TOKENS); the token-tile
#: GEMM takes any number.
MAX_TOKENS = 16


@cache
def _library() -> _native.NativeLibrary | None:
    """The built library; None where it cannot be built."""
    return _native.load(*LIBRARY)


def compiled_paths() -> tuple[str, ...]:
    """The dot paths this host's build has (plain always; avx2 and vnni where the
    compiler targets them), best last; empty without a library."""
    library = _library()
    if library is None:
        return ()
    bits = library.accord_gguf_paths()
    return tuple(name for name, code in PATHS.items() if bits >> code & 1)


def dot(
    x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, quant_type: str, path: str,
    out: torch.Tensor, scratch: torch.Tensor, kernel: str = "row dot",
) -> None:
    """out [T, N] fp32 = x [T, K] fp32 @ W^T (+ fp32 bias), x quantised to int8 per 32, by
    `kernel` (`KERNELS`): the row dot (T <= MAX_TOKENS) or the token-tile GEMM (any T);
    all contiguous, `scratch` uint8 of `scratch_bytes(T, K)`."""
    tokens, depth = x.shape
    status = _library().accord_gguf_linear(  # type: ignore[union-attr]
        x.data_ptr(), qweight.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(), tokens,
        qweight.shape[0], depth, FORMAT_CODES[quant_type], PATHS[path], KERNELS[kernel], scratch.data_ptr(),
        torch.get_num_threads(),
    )
    if status:
        raise ValueError(
            f"gguf_quant_gemm: path {path!r} is not built here, {tokens} tokens exceed the row dot's {MAX_TOKENS}, "
            "or a token-tile panel could not be allocated"
        )


def scratch_bytes(tokens: int, depth: int) -> int:
    """Bytes of the dot path's scratch: int8 codes, a scale per 32 and a sum per 16."""
    return tokens * (depth + depth // 32 * 4 + depth // 16 * 4)


def dequantize(qweight: torch.Tensor, first: int, out: torch.Tensor, quant_type: str) -> None:
    """Rows [first, first + out.shape[0]) of the packed weight into `out` (fp32 [rows, K])."""
    count, depth = out.shape
    _library().accord_gguf_dequantize(  # type: ignore[union-attr]
        qweight.data_ptr(), out.data_ptr(), first, count, depth, FORMAT_CODES[quant_type], torch.get_num_threads()
    )


def embedding(ids: torch.Tensor, qweight: torch.Tensor, out: torch.Tensor, quant_type: str) -> None:
    """out [T, K] (fp32 or bf16, contiguous) = the rows `ids` (int64 [T]) of the packed
    table, dequantised; IndexError, with nothing written, for an id outside the table."""
    tokens, depth = out.shape
    status = _library().accord_gguf_embedding(  # type: ignore[union-attr]
        qweight.data_ptr(), ids.data_ptr(), out.data_ptr(), tokens, qweight.shape[0], depth,
        FORMAT_CODES[quant_type], int(out.dtype == torch.bfloat16),
    )
    if status:
        raise IndexError(f"quant_embedding: a token id is outside the table's {qweight.shape[0]} rows")
