"""MoE kernels: routing (scores, group-limited top-k or hash selection, combine
weights) and the fused experts, tokens grouped by expert so each active expert runs
two GEMMs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._fp8 import dequantise_blocks
from ._precision import work_dtype
from ._registry import KERNELS

#: DeepSeek's weight_scale_inv tiles: one fp32 scale per 128x128 block of a weight.
WEIGHT_BLOCK = 128
#: A group's score is the sum of its best this many expert choices (DeepSeek-V3).
GROUP_SCORE_EXPERTS = 2


def _router_scores(router_logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """softmax, sigmoid or sqrt(softplus) of the logits, in fp32."""
    logits = router_logits.float()
    if scoring == "softmax":
        return logits.softmax(dim=1)
    if scoring == "sigmoid":
        return logits.sigmoid()
    return F.softplus(logits).sqrt_()


def _best_groups_only(choice: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """`choice` with the experts of all but each row's `topk_group` best groups at -inf."""
    grouped = choice.view(choice.shape[0], n_group, -1)
    best_in_group = grouped.topk(min(GROUP_SCORE_EXPERTS, grouped.shape[2]), dim=2, sorted=False).values
    kept_groups = best_in_group.sum(dim=2).topk(topk_group, dim=1, sorted=False).indices
    dropped = torch.ones(grouped.shape[:2], dtype=torch.bool).scatter_(1, kept_groups, False)
    return grouped.masked_fill(dropped.unsqueeze(2), float("-inf")).view_as(choice)


@KERNELS.register("moe_route")
def moe_route(
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
    """Each token's experts and combine weights; the bias steers the choice only."""
    scores = _router_scores(router_logits, scoring)
    if selection == "hash":
        chosen = hash_table.index_select(0, token_ids.long()).long()
    else:
        choice = scores if correction_bias is None else scores + correction_bias
        if n_group > 1:
            choice = _best_groups_only(choice, n_group, topk_group)
        chosen = choice.topk(top_k, dim=1, sorted=False).indices
    weights = scores.gather(1, chosen)
    if renormalize:
        weights.div_(weights.sum(dim=1, keepdim=True))
    torch.mul(weights, routed_scaling_factor, out=topk_weights)
    topk_ids.copy_(chosen)


def _expert_weight(weights: torch.Tensor, scales: torch.Tensor | None, expert: int, dtype: torch.dtype) -> torch.Tensor:
    """One expert's weight in `dtype`, dequantised by its block scales when fp8 (per
    call: nothing is cached, so the memory cost stays that of the fp8 weights)."""
    if scales is None:
        return weights[expert].to(dtype)
    return dequantise_blocks(weights[expert], scales[expert], WEIGHT_BLOCK, WEIGHT_BLOCK).to(dtype)


@KERNELS.register("fused_moe")
def fused_moe(
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
    """Weighted sum of each token's chosen experts' SwiGLU MLPs, accumulated in fp32."""
    top_k = topk_ids.shape[1]
    experts = topk_ids.reshape(-1).long()
    if expert_map is not None:
        experts = expert_map.long().index_select(0, experts)
    # Sorting the (token, slot) picks by expert makes each expert's picks one slice;
    # ids shift by one so the -1s (experts on other ranks) sort into a bucket skipped.
    order = torch.argsort(experts, stable=True)
    ends = torch.bincount(experts + 1, minlength=w13.shape[0] + 1).cumsum(0).tolist()
    # fp8 weights dequantise to fp32 values that bf16 cannot hold: their GEMMs run in
    # fp32, rounded once. Half weights run in the CPU's native dtype where it has one,
    # rounding the intermediates as the contract allows.
    dtype = torch.float32 if w13_scale is not None else work_dtype(hidden.dtype)
    x = hidden.to(dtype)
    total = out if out.dtype == torch.float32 else torch.empty(out.shape, dtype=torch.float32)
    total.zero_()
    pick_weights = topk_weights.reshape(-1)
    intermediate = w13.shape[1] // 2
    for expert in range(w13.shape[0]):
        if ends[expert] == ends[expert + 1]:
            continue
        picks = order[ends[expert] : ends[expert + 1]]
        tokens = picks // top_k
        gate_up = F.linear(x.index_select(0, tokens), _expert_weight(w13, w13_scale, expert, dtype))
        gate, up = gate_up[:, :intermediate], gate_up[:, intermediate:]
        if swiglu_limit > 0:
            gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
        activated = F.silu(gate).mul_(up)
        expert_out = F.linear(activated, _expert_weight(w2, w2_scale, expert, dtype)).float()
        total.index_add_(0, tokens, expert_out.mul_(pick_weights.index_select(0, picks)[:, None]))
    if total is not out:
        out.copy_(total)
