"""The bf16-weight GEMM of bf16_weight_gemm.c (with the one-pass packing of a weight
into its blocked bf16 layout that the load makes), built and loaded by `_native`."""

from __future__ import annotations

import ctypes
from functools import cache

import torch

from . import _native


#: The entry points of bf16_weight_gemm.c.
SIGNATURES = (
    ("accord_bf16_weight_gemm", ctypes.c_int, (ctypes.c_void_p,) * 4 + (ctypes.c_long,) * 5 + (ctypes.c_int,) * 3),
    (
        "accord_pack_bf16_weight", ctypes.c_int,
        (ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int),
    ),
)
#: What `_native.load` builds and loads (and `_native.build_ahead` starts building).
LIBRARY = ("bf16_weight_gemm.c", SIGNATURES)


@cache  # the kernels call this per op: one lookup, not a hash of the signatures
def _library() -> _native.NativeLibrary | None:
    """The built library with its entry points typed; None where it cannot be built."""
    return _native.load(*LIBRARY)


def available() -> bool:
    """Whether the library is built (or can be) on this host."""
    return _library() is not None


class Bf16Weight:
    """A weight [N, K] packed as bf16 into the GEMM's blocked layout (`packed`, opaque:
    see bf16_weight_gemm.c), callable as the bf16-weight GEMM on it: what every call needs
    of the weight (its data pointer, sizes, the typed entry point) is bound once here,
    because a decode step makes one such call per projection and each Python-level step
    of it costs a microsecond or more. Build it with `bf16_weight` or `exact_bf16`."""

    __slots__ = ("packed", "_gemm", "_pointer", "_rows", "_depth")

    def __init__(self, packed: torch.Tensor, rows: int, depth: int) -> None:
        self.packed = packed
        self._gemm = _library().accord_bf16_weight_gemm  # type: ignore[union-attr]
        self._pointer = packed.data_ptr()
        self._rows, self._depth = rows, depth

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        """out [M, N] = x [M, K] @ W^T (+ bias) with fp32 accumulation, on torch's thread
        count: x fp32 or bf16; bias and out both fp32, or both bf16 (out then rounded
        once). x and out need unit column strides, bias contiguity; the caller keeps to
        that and to those dtypes (checking them here would cost each decode projection)."""
        if self._gemm(
            x.data_ptr(), self._pointer, None if bias is None else bias.data_ptr(), out.data_ptr(),
            x.shape[0], self._rows, self._depth, x.stride(0), out.stride(0), torch.get_num_threads(),
            x.dtype is torch.bfloat16, out.dtype is torch.bfloat16,
        ):
            raise MemoryError(f"the bf16-weight GEMM could not widen {tuple(x.shape)} bf16 activations to fp32")


def _pack(weight: torch.Tensor) -> tuple[Bf16Weight, bool]:
    """`weight` (bf16, or fp32 taken as its bf16 high halves) packed, and whether that
    lost nothing (an fp32 value with nonzero low bits is not exactly bf16)."""
    weight = weight.contiguous()
    rows, depth = weight.shape
    packed = torch.empty(weight.numel(), dtype=torch.bfloat16)
    exact = _library().accord_pack_bf16_weight(  # type: ignore[union-attr]
        weight.data_ptr(), int(weight.dtype == torch.float32), packed.data_ptr(), rows, depth,
        torch.get_num_threads(),
    )
    return Bf16Weight(packed, rows, depth), bool(exact)


def bf16_weight(weight: torch.Tensor) -> Bf16Weight:
    """The GEMM on a bf16 weight [N, K]; only when `available()`."""
    if weight.dtype != torch.bfloat16:
        raise TypeError(f"bf16_weight takes a bfloat16 weight, got {weight.dtype}")
    return _pack(weight)[0]


def exact_bf16(weight: torch.Tensor) -> Bf16Weight | None:
    """The GEMM on an fp32 weight [N, K] streamed as bf16 when its values are all exactly
    bf16 (one pass, no temporaries), else None; only when `available()`."""
    streamed, exact = _pack(weight)
    return streamed if exact else None
