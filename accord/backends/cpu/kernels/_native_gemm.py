"""The bf16-weight GEMM of bf16_weight_gemm.c (with the one-pass bf16 copy the load
makes), built and loaded by `_native`."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from . import _native


#: The entry points of bf16_weight_gemm.c.
SIGNATURES = (
    ("accord_bf16_weight_gemm", None, (ctypes.c_void_p,) * 4 + (ctypes.c_long,) * 5 + (ctypes.c_int,)),
    ("accord_exact_bf16", ctypes.c_int, (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int)),
)


@cache  # the kernels call this per op: one lookup, not a hash of the signatures
def _library() -> _native.NativeLibrary | None:
    """The built library with its entry points typed; None where it cannot be built."""
    return _native.load("bf16_weight_gemm.c", SIGNATURES)


def available() -> bool:
    """Whether the library is built (or can be) on this host."""
    return _library() is not None


class Bf16Weight:
    """An exact bf16 copy of an fp32 weight [N, K] (`copy`), callable as the bf16-weight
    GEMM on it: what every call needs of the weight (its data pointer, sizes, the typed
    entry point) is bound once here, because a decode step makes one such call per
    projection and each Python-level step of it costs a microsecond or more."""

    __slots__ = ("copy", "_gemm", "_pointer", "_rows", "_depth")

    def __init__(self, copy: torch.Tensor) -> None:
        self.copy = copy.contiguous()
        self._gemm = _library().accord_bf16_weight_gemm  # type: ignore[union-attr]
        self._pointer = self.copy.data_ptr()
        self._rows, self._depth = self.copy.shape

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        """out [M, N] fp32 = x [M, K] fp32 @ copy^T (+ bias fp32), fp32 accumulation, on
        torch's thread count. x and out need unit column strides, bias contiguity."""
        self._gemm(
            x.data_ptr(), self._pointer, None if bias is None else bias.data_ptr(), out.data_ptr(),
            x.shape[0], self._rows, self._depth, x.stride(0), out.stride(0), torch.get_num_threads(),
        )


def exact_bf16(weight: torch.Tensor) -> Bf16Weight | None:
    """A contiguous fp32 tensor's values as bf16 (ready for the GEMM) when they are all
    exactly bf16 (one pass, no temporaries), else None; only when `available()`."""
    copy = torch.empty(weight.shape, dtype=torch.bfloat16)
    exact = _library().accord_exact_bf16(  # type: ignore[union-attr]
        weight.data_ptr(), copy.data_ptr(), weight.numel(), torch.get_num_threads()
    )
    return Bf16Weight(copy) if exact else None
