"""The group-quantised kernels of group_quant_gemm.c (the fp32 row dot over packed int32
codes, and the dequantisation of rows to fp32), built and loaded by `_native`."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from . import _native

_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int

#: The entry points of group_quant_gemm.c.
SIGNATURES = (
    ("accord_group_quant_linear", _I, (_P, _P, _P, _P, _P, _P, _P, _L, _L, _L, _I, _L, _L, _I)),
    ("accord_group_quant_dequantize", _I, (_P, _P, _P, _P, _P, _L, _L, _L, _I, _L, _L, _I)),
)
LIBRARY = ("group_quant_gemm.c", SIGNATURES)


@cache
def library() -> _native.NativeLibrary | None:
    """The built library; None where it cannot be built."""
    return _native.load(*LIBRARY)


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
    g_idx: torch.Tensor | None, bias: torch.Tensor | None, out: torch.Tensor, bits: int, group_size: int,
) -> None:
    """out [T, N] fp32 = x [T, K] fp32 @ W^T (+ fp32 bias), every row dequantised once;
    scales fp32, all contiguous."""
    tokens, depth = x.shape
    status = library().accord_group_quant_linear(  # type: ignore[union-attr]
        x.data_ptr(), qweight.data_ptr(), scales.data_ptr(), _pointer(zeros), _pointer(g_idx), _pointer(bias),
        out.data_ptr(), tokens, qweight.shape[0], depth, bits, group_size, scales.shape[1], torch.get_num_threads(),
    )
    if status:
        raise MemoryError("group_quant_gemm: a row buffer could not be allocated")


def dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, g_idx: torch.Tensor | None,
    first: int, out: torch.Tensor, bits: int, group_size: int,
) -> None:
    """Rows [first, first + out.shape[0]) of the weight into `out` (fp32 [rows, K])."""
    count, depth = out.shape
    library().accord_group_quant_dequantize(  # type: ignore[union-attr]
        qweight.data_ptr(), scales.data_ptr(), _pointer(zeros), _pointer(g_idx), out.data_ptr(), first, count, depth,
        bits, group_size, scales.shape[1], torch.get_num_threads(),
    )
