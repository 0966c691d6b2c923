"""Contracts of mixture-of-experts routing and the fused expert computation.

Index tensors here are where vendors disagree most (the motivating crash: a router
kernel handed int64 top-k ids read its int32 companions as int64). Every index tensor
is read at its own width: `topk_ids`, `expert_map`, `token_ids` and `hash_table` may
each be int32 or int64 independently, and the width of the ids moe_route writes is the
caller's choice (`ids_dtype`), allocated by the dispatcher.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..spec import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES, OpContract, OutputSpec, ParamSpec, Rule, TensorSpec, UnorderedRows, dtype_name
from .common import ELEMENTWISE, FP32_ACCUMULATED, REDUCTION


def _route_inputs_present(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    if call["selection"] == "hash":
        for name in ("token_ids", "hash_table"):
            if call[name] is None:
                return name, "a tensor (hash selection)", "absent"
        if call["hash_table"].shape[1] != call["top_k"]:
            return "hash_table", f"{call['top_k']} columns (top_k)", str(call["hash_table"].shape[1])
        return None
    experts = call["router_logits"].shape[1]
    if not 0 < call["top_k"] <= experts:
        return "top_k", f"1..{experts} (number of experts)", str(call["top_k"])
    n_group, topk_group = call["n_group"], call["topk_group"]
    if n_group < 1 or experts % n_group:
        return "n_group", f"a divisor of {experts} experts", str(n_group)
    if not 1 <= topk_group <= n_group:
        return "topk_group", f"1..{n_group} (n_group)", str(topk_group)
    if n_group > 1 and call["top_k"] > topk_group * (experts // n_group):
        return "top_k", f"at most topk_group * experts per group = {topk_group * (experts // n_group)}", str(call["top_k"])
    return None


MOE_ROUTE = OpContract(
    name="moe_route",
    doc=(
        "scores = softmax | sigmoid | sqrt(softplus) of router_logits in fp32. Selection "
        "'topk': choice = scores + correction_bias (when given); with n_group > 1 the "
        "experts split into n_group equal groups, a group's score is the sum of its two "
        "best choices, all but the best topk_group groups are masked to -inf; topk_ids = "
        "top_k of choice. Selection 'hash': topk_ids = hash_table[token_ids]. Then "
        "topk_weights = scores at topk_ids (bias never enters a weight), divided by their "
        "sum when renormalize, times routed_scaling_factor. Id order within a row is not "
        "part of the contract (compared as sets)."
    ),
    tensors=(
        TensorSpec("router_logits", FLOAT_DTYPES, ("T", "E")),
        TensorSpec("correction_bias", (torch.float32,), ("E",), "e_score_correction_bias", optional=True),
        TensorSpec("token_ids", INDEX_DTYPES, ("T",), "token id of each row (hash routing)", optional=True, index=True),
        TensorSpec("hash_table", INDEX_DTYPES, ("V", "K"), "token id -> its experts (tid2eid)", optional=True, index=True),
    ),
    params=(
        ParamSpec("top_k", int),
        ParamSpec("scoring", str, "softmax", choices=("softmax", "sigmoid", "sqrt_softplus")),
        ParamSpec("selection", str, "topk", choices=("topk", "hash")),
        ParamSpec("renormalize", bool, False, choices=(True, False)),
        ParamSpec("n_group", int, 1),
        ParamSpec("topk_group", int, 1),
        ParamSpec("routed_scaling_factor", float, 1.0),
        ParamSpec("ids_dtype", torch.dtype, torch.int32, choices=INDEX_DTYPES, doc="width of topk_ids"),
    ),
    outputs=(
        OutputSpec("topk_weights", ("T", "top_k"), torch.float32),
        OutputSpec("topk_ids", ("T", "top_k"), "param:ids_dtype", index=True),
    ),
    primary="router_logits",
    tolerance=ELEMENTWISE,
    unordered_rows=UnorderedRows("topk_ids", ("topk_weights",)),
    rules=(Rule("selection inputs are present and top_k/n_group/topk_group fit", _route_inputs_present),),
)


def _weights_quantised_consistently(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    weight_dtype, hidden_dtype = call["w13"].dtype, call["hidden"].dtype
    scales = (call["w13_scale"], call["w2_scale"])
    if weight_dtype in FP8_DTYPES:
        for name, scale in zip(("w13_scale", "w2_scale"), scales):
            if scale is None:
                return name, "128x128 block scales for fp8 weights", "absent"
        return None
    if weight_dtype != hidden_dtype:
        return "w13", f"{dtype_name(hidden_dtype)} (like hidden) or fp8", dtype_name(weight_dtype)
    for name, scale in zip(("w13_scale", "w2_scale"), scales):
        if scale is not None:
            return name, "absent for unquantised weights", "a tensor"
    return None


FUSED_MOE = OpContract(
    name="fused_moe",
    doc=(
        "out[t] = sum_k topk_weights[t, k] * w2[e] @ (silu(g) * u) with g = w13[e, :I] @ "
        "x and u = w13[e, I:] @ x (with swiglu_limit L > 0, DeepSeek-V4's clipping: g = "
        "min(g, L), u = clamp(u, -L, L)) and e = topk_ids[t, k], mapped through expert_map (global -> "
        "local id, -1: not on this rank, contributes nothing) when one is given. fp8 "
        "weights are dequantised as w * scale[i // 128, j // 128] (DeepSeek's "
        "weight_scale_inv). Accumulation in fp32, rounded once to hidden's dtype. With "
        "fp8 weights every step is fp32 (the dequantised weights are not half values), so "
        "the result is within fp32 accuracy before that one rounding. With fp16/bf16 "
        "weights the expert GEMMs may run in that dtype, rounding the intermediates "
        "(w13 @ x and the activation) to it, as vLLM's fused_moe does; the sum over experts "
        "stays fp32."
    ),
    tensors=(
        TensorSpec("hidden", FLOAT_DTYPES, ("T", "H")),
        TensorSpec("w13", FLOAT_DTYPES + FP8_DTYPES, ("E", "2*I", "H"), "gate and up projections stacked"),
        TensorSpec("w2", FLOAT_DTYPES + FP8_DTYPES, ("E", "H", "I"), "down projections stacked"),
        TensorSpec("topk_weights", (torch.float32,), ("T", "K")),
        TensorSpec("topk_ids", INDEX_DTYPES, ("T", "K"), index=True),
        TensorSpec("expert_map", INDEX_DTYPES, ("EG",), "global expert -> local id or -1", optional=True, index=True),
        TensorSpec("w13_scale", (torch.float32,), ("E", "cdiv(2*I,128)", "cdiv(H,128)"), optional=True),
        TensorSpec("w2_scale", (torch.float32,), ("E", "cdiv(H,128)", "cdiv(I,128)"), optional=True),
    ),
    params=(
        ParamSpec("activation", str, "silu", choices=("silu",)),
        ParamSpec("swiglu_limit", float, 0.0, doc="clip of the pre-activations; 0: none"),
    ),
    outputs=(OutputSpec("out", ("T", "H"), "like:hidden"),),
    primary="hidden",
    tolerance={dtype: REDUCTION[dtype] for dtype in FLOAT_DTYPES},
    fp8_tolerance=FP32_ACCUMULATED,
    dtype_groups=(("w13", "w2"),),
    rules=(Rule("weights match hidden's dtype, or are fp8 with block scales", _weights_quantised_consistently),),
)

CONTRACTS = (MOE_ROUTE, FUSED_MOE)
