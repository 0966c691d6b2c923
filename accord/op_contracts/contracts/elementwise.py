"""Contracts of the per-token ops: RMS norm (plain and with a fused residual add),
rotary position embedding and the gated SiLU activation."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..spec import FLOAT_DTYPES, INDEX_DTYPES, OpContract, OutputSpec, ParamSpec, Rule, TensorSpec
from .common import ELEMENTWISE, ROUNDED_ONCE

RMS_NORM = OpContract(
    name="rms_norm",
    doc=(
        "out = x * rsqrt(mean(x^2, -1) + eps) * weight, the mean taken in fp32, the "
        "product rounded once to x's dtype (Llama's RMSNorm)."
    ),
    tensors=(
        TensorSpec("x", FLOAT_DTYPES, ("T", "H"), "activations, one row per token"),
        TensorSpec("weight", FLOAT_DTYPES, ("H",), "per-channel gain"),
    ),
    params=(ParamSpec("eps", float, 1e-6, doc="added to the mean square"),),
    outputs=(OutputSpec("out", ("T", "H"), "like:x"),),
    primary="x",
    tolerance=ELEMENTWISE,
    ulps=ROUNDED_ONCE,
    dtype_groups=(("x", "weight"),),
)

FUSED_ADD_RMS_NORM = OpContract(
    name="fused_add_rms_norm",
    doc=(
        "residual_out = x + residual (added in fp32, stored in x's dtype); out = "
        "rms_norm(residual_out) as rms_norm defines it. The pre-norm block's seam."
    ),
    tensors=(
        TensorSpec("x", FLOAT_DTYPES, ("T", "H"), "the sub-layer's output"),
        TensorSpec("residual", FLOAT_DTYPES, ("T", "H"), "the running residual stream"),
        TensorSpec("weight", FLOAT_DTYPES, ("H",), "per-channel gain"),
    ),
    params=(ParamSpec("eps", float, 1e-6),),
    outputs=(
        OutputSpec("out", ("T", "H"), "like:x", "normalised sum"),
        OutputSpec("residual_out", ("T", "H"), "like:x", "x + residual"),
    ),
    primary="x",
    tolerance=ELEMENTWISE,
    ulps=ROUNDED_ONCE,
    dtype_groups=(("x", "residual", "weight"),),
)


def _even_rotary_dim(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    rotary_dim, head_dim = call["cos_sin_cache"].shape[1], call["query"].shape[2]
    if rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim:
        return None
    return "cos_sin_cache", f"an even rotary dim <= head dim {head_dim}", str(rotary_dim)


ROTARY_EMBEDDING = OpContract(
    name="rotary_embedding",
    doc=(
        "Rotates the first R dims of every head of query and key by the angle table "
        "row of each token's position; dims past R pass through (partial rotary, as "
        "MLA's decoupled rope uses). cos = cos_sin_cache[pos, :R/2], sin = "
        "cos_sin_cache[pos, R/2:]. neox layout pairs dim i with i+R/2; gpt-j layout "
        "pairs 2i with 2i+1. For each pair (a, b): (a*cos - b*sin, b*cos + a*sin), "
        "computed in fp32 and rounded once."
    ),
    tensors=(
        TensorSpec("positions", INDEX_DTYPES, ("T",), "absolute position of each token", index=True),
        TensorSpec("query", FLOAT_DTYPES, ("T", "Hq", "D")),
        TensorSpec("key", FLOAT_DTYPES, ("T", "Hk", "D")),
        TensorSpec("cos_sin_cache", (torch.float32,), ("P", "R"), "cos|sin halves per position"),
    ),
    params=(ParamSpec("is_neox", bool, True, choices=(True, False), doc="neox (True) or gpt-j layout"),),
    outputs=(
        OutputSpec("query_out", ("T", "Hq", "D"), "like:query"),
        OutputSpec("key_out", ("T", "Hk", "D"), "like:key"),
    ),
    primary="query",
    tolerance=ELEMENTWISE,
    ulps=ROUNDED_ONCE,
    dtype_groups=(("query", "key"),),
    rules=(Rule("the rotary dim R is even and at most the head dim", _even_rotary_dim),),
)

SILU_AND_MUL = OpContract(
    name="silu_and_mul",
    doc="out = silu(x[:, :I]) * x[:, I:], computed in fp32 and rounded once (SwiGLU).",
    tensors=(TensorSpec("x", FLOAT_DTYPES, ("T", "2*I"), "gate and up projections side by side"),),
    params=(),
    outputs=(OutputSpec("out", ("T", "I"), "like:x"),),
    primary="x",
    tolerance=ELEMENTWISE,
    ulps=ROUNDED_ONCE,
)

CONTRACTS = (RMS_NORM, FUSED_ADD_RMS_NORM, ROTARY_EMBEDDING, SILU_AND_MUL)
