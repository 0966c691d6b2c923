"""moe_route on the gating operators and fused_moe on torch-npu's routing pipeline:
npu_moe_init_routing -> npu_moe_compute_expert_tokens -> npu_grouped_matmul (w13) ->
npu_swiglu (npu_clipped_swiglu with DeepSeek-V4's swiglu_limit) -> npu_grouped_matmul
(w2) -> npu_moe_finalize_routing.

Declared restrictions: every expert id these operators take is int32, so topk_ids and
expert_map narrow to int32 through declared adapters; the gating operators return
weights at the logits' dtype and take the bias at it, so router logits widen (exactly)
to fp32 through a declared adapter, as the contract scores in fp32; grouped expert
selection needs more than 2 experts per group and at most 2048 experts; fp8 expert
weights are refused (npu_grouped_matmul on A2/A3 takes fp16/bf16/fp32/int8 weights).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from ....op_contracts import FLOAT_DTYPES, CastAdapter, ContractError, KernelSet

#: npu_moe_gating_top_k's norm_type per contract scoring (sqrt-softplus has none).
NORM_TYPES = {"softmax": 0, "sigmoid": 1}
MAX_GATING_EXPERTS = 2048
#: group_select_mode 1: a group's score is the sum of its two best experts.
SUM_OF_TOP_TWO = 1


def _check_grouping(experts: int, n_group: int) -> None:
    if experts > MAX_GATING_EXPERTS:
        raise ContractError("moe_route", "router_logits", f"at most {MAX_GATING_EXPERTS} experts (npu_moe_gating_top_k)",
                            str(experts), "ascend")
    if n_group > 1 and experts // n_group <= 2:
        raise ContractError("moe_route", "n_group", "groups of more than 2 experts (npu_moe_gating_top_k)",
                            f"{experts // n_group} experts per group", "ascend")


def _sqrt_softplus_route(
    logits: torch.Tensor, bias: torch.Tensor | None, token_ids: torch.Tensor | None, hash_table: torch.Tensor | None,
    top_k: int, n_group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, ids) in plain torch: no NPU gating operator has a sqrt-softplus norm."""
    if n_group > 1:
        raise ContractError("moe_route", "n_group", "1 with sqrt_softplus scoring (no NPU gating operator computes it; "
                            "the plain-torch path selects ungrouped)", str(n_group), "ascend")
    scores = F.softplus(logits).sqrt()
    if hash_table is not None and token_ids is not None:
        return scores, hash_table.index_select(0, token_ids.long())
    choice = scores if bias is None else scores + bias
    return scores, choice.topk(top_k, dim=-1).indices


def moe_route(
    npu: Any,
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    token_ids: torch.Tensor | None,
    hash_table: torch.Tensor | None,
    top_k: int,
    scoring: str,
    selection: str,
    renormalize: bool,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float,
    ids_dtype: torch.dtype,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> None:
    """Plain softmax top-k: npu_moe_gating_top_k_softmax. Grouped, biased, sigmoid or
    hash routing: npu_moe_gating_top_k, whose fp32 norm output (out_flag) gives the
    weights, so the bias never enters one. Renormalising and scaling follow in fp32."""
    hashed = selection == "hash"
    _check_grouping(router_logits.shape[1], n_group)
    if scoring not in NORM_TYPES:
        scores, ids = _sqrt_softplus_route(router_logits, correction_bias, token_ids, hash_table, top_k, n_group)
        weights = scores.gather(1, ids.long())
    elif not hashed and scoring == "softmax" and correction_bias is None and n_group == 1:
        weights, ids, _ = npu.npu_moe_gating_top_k_softmax(router_logits, None, k=top_k)
    else:
        _, ids, norm = npu.npu_moe_gating_top_k(
            router_logits,
            top_k,
            bias=correction_bias,
            input_ids=token_ids if hashed else None,
            tid2eid=hash_table if hashed else None,
            k_group=topk_group,
            group_count=n_group,
            group_select_mode=SUM_OF_TOP_TWO,
            norm_type=NORM_TYPES[scoring],
            out_flag=True,
        )
        weights = norm.gather(1, ids.long())
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    torch.mul(weights, routed_scaling_factor, out=topk_weights)
    topk_ids.copy_(ids)  # the operators' int32 ids, at the width the caller asked for


def _swiglu(npu: Any, gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(gate) * up; with DeepSeek-V4's limit, npu_clipped_swiglu in its plain form
    (alpha 1, bias 0, halves not interleaved): gate clipped above at limit, up to
    +-limit, as the contract clips."""
    if limit <= 0:
        return npu.npu_swiglu(gate_up, dim=-1)
    return npu.npu_clipped_swiglu(gate_up, dim=-1, alpha=1.0, limit=limit, bias=0.0, interleaved=False)


def fused_moe(
    npu: Any,
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    expert_map: torch.Tensor | None,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    activation: str,
    swiglu_limit: float,
    out: torch.Tensor,
) -> None:
    """Route, two grouped GEMMs around swiglu, combine. An expert off this rank
    (expert_map -1) is sent to local expert 0 with weight 0. The weights' [E, N, K]
    layout is handed to npu_grouped_matmul as its documented transposed-weight form;
    the combine runs in fp32 so the routing weights enter unrounded."""
    tokens, top_k = topk_ids.shape
    ids, weights = topk_ids, topk_weights
    if expert_map is not None:
        local = expert_map.index_select(0, ids.flatten()).view_as(ids)
        weights = weights.masked_fill(local < 0, 0.0)
        ids = local.clamp(min=0)
    row_idx = torch.arange(tokens * top_k, dtype=torch.int32, device=hidden.device).view(top_k, tokens).t().contiguous()
    expanded, expanded_row_idx, expanded_expert_idx = npu.npu_moe_init_routing(hidden, row_idx, ids, tokens)
    # The counts come back int32; npu_grouped_matmul's group_list is int64 only.
    group_list = npu.npu_moe_compute_expert_tokens(expanded_expert_idx, w13.shape[0]).to(torch.int64)
    grouped = partial(npu.npu_grouped_matmul, group_list=group_list, split_item=2, group_type=0, group_list_type=0)
    gate_up = grouped([expanded], [w13.transpose(1, 2)])[0]
    down = grouped([_swiglu(npu, gate_up, swiglu_limit)], [w2.transpose(1, 2)])[0]
    combined = npu.npu_moe_finalize_routing(down.float(), None, None, None, weights, expanded_row_idx, ids, drop_pad_mode=0)
    out.copy_(combined)


def register(kernels: KernelSet, npu: Any) -> None:
    """Add both MoE kernels with their declared adapters and claims."""
    kernels.register(
        "moe_route",
        claims={"router_logits": (torch.float32,)},
        adapters=(CastAdapter("router_logits", torch.float32),),
    )(partial(moe_route, npu))
    kernels.register(
        "fused_moe",
        claims={"topk_ids": (torch.int32,), "expert_map": (torch.int32,), "w13": FLOAT_DTYPES, "w2": FLOAT_DTYPES},
        adapters=(CastAdapter("topk_ids", torch.int32), CastAdapter("expert_map", torch.int32)),
    )(partial(fused_moe, npu))
