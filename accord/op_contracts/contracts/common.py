"""Tolerance tables and rule helpers shared by the contract families."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..spec import FLOAT_DTYPES, FP8_DTYPES, OutputSpec, ParamSpec, Rule, TensorSpec, dtype_name

#: NMSE bounds (sum((out-ref)^2) / sum(ref^2), as llama.cpp's test-backend-ops) for ops
#: whose outputs are elementwise in their inputs: one rounding of the output dtype.
ELEMENTWISE = {torch.float32: 1e-9, torch.float16: 1e-5, torch.bfloat16: 1e-4}
#: For reductions over long axes (GEMMs, attention, expert sums): accumulation order
#: differs between backends, so the bounds are looser; fp8 paths pay for quantisation.
REDUCTION = {
    torch.float32: 1e-7,
    torch.float16: 1e-4,
    torch.bfloat16: 1e-3,
    torch.float8_e4m3fn: 5e-3,
}

#: NMSE bounds for a sum of exact products (fp8 operands are exact values) accumulated
#: in fp32 and rounded once, by the output's dtype. A correct kernel differs from the
#: correctly rounded reference by one ulp on the rare elements its fp32 sum puts on
#: the other side of a rounding midpoint (measured: cpu bf16 0, fp16 8e-11, fp32 2e-14
#: on scaled_mm and fused_moe). Half outputs allow about 1/64 of a squared ulp; fp32
#: allows the accumulation error of a few thousand terms. A bf16 running sum (two
#: 128-wide K groups) measures 4e-6..3e-5, so it fails at every output width.
FP32_ACCUMULATED = {torch.float32: 1e-10, torch.float16: 1e-8, torch.bfloat16: 1e-6}
#: Ulp bounds (of each output's dtype, against the fp64 reference rounded once) for ops
#: computed in fp32 and rounded once. Half outputs: 1 ulp, since the fp32 arithmetic's
#: error is far below half an ulp, so a correct kernel can land on the neighbour of the
#: reference's rounding only at a midpoint. fp32 outputs carry the fp32 arithmetic's
#: own error: 4 ulps (measured: cpu <= 2, triton <= 3, the mean of squares in fused_add_rms_norm).
ROUNDED_ONCE = {torch.bfloat16: 1, torch.float16: 1, torch.float32: 4}
#: Cache writes: copies, or one fp32 division rounded to fp8 exactly as the reference
#: does it, so every stored bit agrees (cpu and triton measured 0).
STORED_EXACTLY = {dtype: 0 for dtype in (*FLOAT_DTYPES, *FP8_DTYPES)}
#: quantize_fp8: q within 1 ulp of its fp8 dtype (a kernel that multiplies by the
#: reciprocal scale, as vLLM's does, may round a midpoint the other way); the scales
#: within 2 fp32 ulps (Triton's fp32 division, div.full.f32, is exact to 2 ulps).
QUANTISED = {**{dtype: 1 for dtype in FP8_DTYPES}, torch.float32: 2}
#: quantize_fp8's codes: the mean signed error (and the mean error away from zero) in
#: fp8 ulps. A round-to-nearest kernel differs only at midpoints, rarely and in both
#: directions (cpu measured 0); round-toward-zero or truncation measures about 1/2.
UNBIASED_CODES = {dtype: 1 / 16 for dtype in FP8_DTYPES}


#: The parts every quantised linear shares (quant_linear, group_quant_linear): the
#: activations, an optional bias in their dtype, and an output in x's dtype or fp32 (the
#: LM head's logits).
QUANT_ACTIVATIONS = TensorSpec("x", FLOAT_DTYPES, ("T", "K"), "activations, one row per token")
QUANT_BIAS = TensorSpec("bias", FLOAT_DTYPES, ("N",), "per-output-channel bias", optional=True)
QUANT_OUT_DTYPE = ParamSpec(
    "out_dtype", torch.dtype, None, choices=(None, torch.float32), doc="the output's, where not x's"
)
QUANT_OUT = OutputSpec("out", ("T", "N"), "param:out_dtype|like:x")


def cache_matches_input(cache: str, source: str) -> Rule:
    """The cache holds the source's dtype, or fp8 (written with a scale)."""

    def check(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
        got, want = call[cache].dtype, call[source].dtype
        if got == want or got in FP8_DTYPES:
            return None
        return cache, f"{dtype_name(want)} (like {source}) or fp8", dtype_name(got)

    return Rule(f"{cache} has {source}'s dtype or an fp8 dtype", check)


def divisible(arg: str, dim: int, by_arg: str, by_dim: int, what: str) -> Rule:
    """`arg.shape[dim]` is a multiple of `by_arg.shape[by_dim]` (GQA head counts)."""

    def check(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
        n, d = call[arg].shape[dim], call[by_arg].shape[by_dim]
        if d > 0 and n % d == 0:
            return None
        return arg, f"{what} (dim {dim} a multiple of {by_arg}.shape[{by_dim}]={d})", str(n)

    return Rule(what, check)
