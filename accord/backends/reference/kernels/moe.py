"""Reference MoE routing (top-k with group limits and correction bias, or token-id
hash) and the fused expert computation (a loop over experts, fp64 accumulation)."""

from __future__ import annotations

import torch

from . import _fp8
from ._registry import KERNELS

#: DeepSeek's weight_scale_inv tiles: one fp32 scale per 128x128 block of a weight.
WEIGHT_BLOCK = 128


def _scores(router_logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Routing scores in fp32, as the contract fixes them (selection is discrete, so
    the golden computes at the width backends are held to)."""
    logits = router_logits.float()
    if scoring == "softmax":
        return torch.softmax(logits, dim=-1)
    if scoring == "sigmoid":
        return torch.sigmoid(logits)
    return torch.sqrt(torch.nn.functional.softplus(logits))


def _mask_to_best_groups(choice: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """`choice` with every expert outside each row's `topk_group` best groups at -inf;
    a group's score is the sum of its two best choices (DeepSeek-V3)."""
    tokens, experts = choice.shape
    grouped = choice.view(tokens, n_group, experts // n_group)
    group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
    best_groups = group_scores.topk(topk_group, dim=-1).indices
    keep = torch.zeros(tokens, n_group, dtype=torch.bool).scatter_(1, best_groups, True)
    return grouped.masked_fill(~keep[:, :, None], float("-inf")).view(tokens, experts)


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
    """Choose each token's experts and their combine weights."""
    scores = _scores(router_logits, scoring)
    if selection == "hash":
        ids = hash_table.long()[token_ids.long()]
    else:
        choice = scores if correction_bias is None else scores + correction_bias
        if n_group > 1:
            choice = _mask_to_best_groups(choice, n_group, topk_group)
        ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    topk_weights.copy_(weights * routed_scaling_factor)
    topk_ids.copy_(ids)


def _expert_weight(weights: torch.Tensor, scales: torch.Tensor | None, expert: int) -> torch.Tensor:
    """One expert's [rows, cols] weight in fp64, dequantised by its block scales if fp8."""
    weight = weights[expert].double()
    if scales is None:
        return weight
    rows, cols = weight.shape
    return weight * _fp8.expand_blocks(scales[expert].double(), WEIGHT_BLOCK, WEIGHT_BLOCK, rows, cols)


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
    """Weighted sum of each token's chosen experts' SwiGLU MLPs."""
    local_ids = topk_ids.long()
    if expert_map is not None:
        local_ids = expert_map.long()[local_ids]
    intermediate = w13.shape[1] // 2
    x = hidden.double()
    total = torch.zeros(hidden.shape, dtype=torch.float64)
    for expert in local_ids.unique().tolist():
        if expert < 0:  # routed to an expert another rank holds
            continue
        tokens, slots = (local_ids == expert).nonzero(as_tuple=True)
        gate_up = x[tokens] @ _expert_weight(w13, w13_scale, expert).T
        gate, up = gate_up[:, :intermediate], gate_up[:, intermediate:]
        if swiglu_limit > 0:
            gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
        act = torch.nn.functional.silu(gate) * up
        expert_out = act @ _expert_weight(w2, w2_scale, expert).T
        total.index_add_(0, tokens, expert_out * topk_weights[tokens, slots].double()[:, None])
    out.copy_(total)
