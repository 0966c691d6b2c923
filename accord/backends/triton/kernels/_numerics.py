"""Rounding, dot products and launch helpers every Triton kernel family shares.

Two Triton interpreter quirks (triton 3.9, TRITON_INTERPRET=1) shape these helpers:
fp32 -> bf16 casts truncate instead of rounding to nearest even, and fp32 -> fp8 casts
mis-round values whose mantissa carries into the exponent (-31.6 became -16). Both are
avoided the same way on every device: the value is first rounded to the target grid in
fp32 with exact IEEE arithmetic, so the final cast has nothing left to round. A third
quirk, `tl.dot` returning garbage for bf16 operands, is avoided by upcasting the
operands to fp32 under the interpreter only (`dot_in_fp32`); GPUs keep native dots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..interpreter import triton_interpreter_enabled


def dot_in_fp32(dtype: torch.dtype) -> bool:
    """Whether dots over `dtype` operands run on fp32 copies: always for fp32 (IEEE,
    not TF32, to honour the fp32 tolerance), and for bf16 under the interpreter."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and triton_interpreter_enabled())


def block_size(n: int, floor: int = 16) -> int:
    """The power-of-two tile width covering `n` elements (at least `floor`, which
    `tl.dot` needs on GPUs)."""
    return max(floor, triton.next_power_of_2(max(n, 1)))


@triton.jit
def dot(a, b, acc, IN_FP32: tl.constexpr):
    """acc + a @ b; in IEEE fp32 when IN_FP32 (see `dot_in_fp32`), natively otherwise."""
    if IN_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _round_to_bf16_grid(x):
    # Round-to-nearest-even on the fp32 bits: add half an ulp of bf16 (minus one when
    # the kept lsb is 0), then clear the 16 dropped bits. Exact for every finite value.
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _round_to_fp8_grid(x, MAX: tl.constexpr, MIN_QUANTUM_EXP: tl.constexpr, HAS_NEG_ZERO: tl.constexpr):
    # Saturate |x|, then round it to the e4m3 grid: the quantum of a value with fp32
    # biased exponent e is 2**(e-127-3) (3 mantissa bits), never below the smallest
    # subnormal 2**(MIN_QUANTUM_EXP-127). Adding and removing 1.5 * 2**23 * quantum
    # rounds to a multiple of it. The sign goes back on afterwards, except on a zero
    # of a format without negative zero (e4m3fnuz's 0x80 is NaN).
    bits = x.to(tl.uint32, bitcast=True)
    magnitude = tl.minimum(tl.abs(x), MAX)
    exponent = ((magnitude.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32)
    quantum = (tl.maximum(exponent - 3, MIN_QUANTUM_EXP) << 23).to(tl.float32, bitcast=True)
    magic = quantum * 12582912.0
    rounded = (magnitude + magic) - magic
    signed = (rounded.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
    if HAS_NEG_ZERO:
        return signed
    return tl.where(rounded == 0.0, 0.0, signed)


@triton.jit
def round_for_store(x, TY: tl.constexpr):
    """fp32 `x` rounded to nearest-even on the grid of dtype TY (fp8 also saturated),
    so that `.to(TY)` is exact on every device and under the interpreter."""
    # The fp8 bounds are FP8_MAX of op_contracts (constexprs cannot read a dict).
    if TY == tl.bfloat16:
        return _round_to_bf16_grid(x)
    elif TY == tl.float8e4nv:
        return _round_to_fp8_grid(x, 448.0, 127 - 9, True)
    elif TY == tl.float8e4b8:
        return _round_to_fp8_grid(x, 240.0, 127 - 10, False)
    else:
        return x


@triton.jit
def store_rounded(ptr, x, mask):
    """Store fp32 `x` at `ptr` in the pointee dtype, rounded to nearest even."""
    ty: tl.constexpr = ptr.dtype.element_ty
    tl.store(ptr, round_for_store(x, ty).to(ty), mask=mask)


@triton.jit
def rounded_like(x, TY: tl.constexpr):
    """fp32 `x` as it reads back after a store in dtype TY (rounded to nearest even)."""
    return round_for_store(x, TY).to(TY).to(tl.float32)
