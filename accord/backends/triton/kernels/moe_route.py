"""MoE routing: softmax / sigmoid / sqrt-softplus scores, group-limited top-k with a
correction bias (DeepSeek-V3), or token-id hash routing. One program per token.

The experts are held as a [groups, experts per group] tile, so group limiting is a
reduction along one axis for any expert count. Ids are written at the width of the
topk_ids output, hash ids read at hash_table's and token_ids' own widths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._registry import KERNELS

_SCORINGS = {"softmax": 0, "sigmoid": 1, "sqrt_softplus": 2}


@triton.jit
def _scores(logits, valid, SCORING: tl.constexpr):
    """Routing scores in fp32 (invalid lanes hold garbage; callers mask them)."""
    if SCORING == 0:
        logits = tl.where(valid, logits, float("-inf"))
        shifted = tl.exp(logits - tl.max(tl.max(logits, axis=1), axis=0))
        return shifted / tl.sum(tl.sum(shifted, axis=1), axis=0)
    elif SCORING == 1:
        return 1.0 / (1.0 + tl.exp(-logits))
    else:
        # softplus(x) = max(x, 0) + log(1 + exp(-|x|)), stable for large |x|.
        return tl.sqrt(tl.maximum(logits, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(logits))))


@triton.jit
def _mask_to_best_groups(choice, valid, n_group, group_size, topk_group, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr):
    """`choice` with every expert outside the `topk_group` best groups at -inf; a
    group scores the sum of its two best choices (its one choice when groups are 1 wide)."""
    best = tl.max(choice, axis=1)
    members = tl.arange(0, BLOCK_S)[None, :]
    first = tl.min(tl.where(choice == best[:, None], members, BLOCK_S), axis=1)
    second = tl.max(tl.where(members == first[:, None], float("-inf"), choice), axis=1)
    group_ids = tl.arange(0, BLOCK_G)
    group_score = tl.where(group_ids < n_group, best + tl.where(group_size >= 2, second, 0.0), float("-inf"))
    keep = group_ids < 0
    for _ in range(topk_group):
        pick = tl.min(tl.where(group_score == tl.max(group_score, axis=0), group_ids, BLOCK_G), axis=0)
        keep |= group_ids == pick
        group_score = tl.where(group_ids == pick, float("-inf"), group_score)
    return tl.where(keep[:, None] & valid, choice, float("-inf"))


@triton.jit
def _moe_route_kernel(
    logits_ptr, bias_ptr, token_ids_ptr, hash_table_ptr, weights_ptr, ids_ptr,
    experts, group_size, n_group, topk_group, top_k, routed_scaling_factor,
    SCORING: tl.constexpr, HASH: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    groups, members = tl.arange(0, BLOCK_G)[:, None], tl.arange(0, BLOCK_S)[None, :]
    expert = groups * group_size + members
    valid = (groups < n_group) & (members < group_size)
    logits = tl.load(logits_ptr + token * experts + expert, mask=valid, other=0.0).to(tl.float32)
    scores = tl.where(valid, _scores(logits, valid, SCORING), 0.0)
    slots = tl.arange(0, BLOCK_K)
    ids = tl.zeros((BLOCK_K,), tl.int64)
    if HASH:
        # Both index tensors are read at their own widths.
        token_id = tl.load(token_ids_ptr + token).to(tl.int64)
        ids = tl.load(hash_table_ptr + token_id * top_k + slots, mask=slots < top_k, other=0).to(tl.int64)
    else:
        choice = scores
        if HAS_BIAS:
            choice += tl.load(bias_ptr + expert, mask=valid, other=0.0)
        choice = tl.where(valid, choice, float("-inf"))
        if n_group > 1:
            choice = _mask_to_best_groups(choice, valid, n_group, group_size, topk_group, BLOCK_G, BLOCK_S)
        for k in range(top_k):
            top = tl.max(tl.max(choice, axis=1), axis=0)
            pick = tl.min(tl.min(tl.where(choice == top, expert, experts), axis=1), axis=0)
            ids = tl.where(slots == k, pick.to(tl.int64), ids)
            choice = tl.where(expert == pick, float("-inf"), choice)
    weights = tl.zeros((BLOCK_K,), tl.float32)
    for k in range(top_k):
        chosen = tl.sum(tl.where(slots == k, ids, 0), axis=0)
        weight = tl.sum(tl.sum(tl.where(expert == chosen, scores, 0.0), axis=1), axis=0)
        weights = tl.where(slots == k, weight, weights)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)
    in_row = slots < top_k
    tl.store(weights_ptr + token * top_k + slots, weights * routed_scaling_factor, mask=in_row)
    tl.store(ids_ptr + token * top_k + slots, ids.to(ids_ptr.dtype.element_ty), mask=in_row)


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
    tokens, experts = router_logits.shape
    if tokens == 0:
        return
    hashed = selection == "hash"
    groups = 1 if hashed else n_group
    group_size = experts // groups
    placeholder = router_logits  # stands in for absent optional tensors; never read
    _moe_route_kernel[(tokens,)](
        router_logits,
        correction_bias if correction_bias is not None else placeholder,
        token_ids if hashed else placeholder,
        hash_table if hashed else placeholder,
        topk_weights, topk_ids,
        experts, group_size, groups, topk_group, top_k, routed_scaling_factor,
        SCORING=_SCORINGS[scoring], HASH=hashed, HAS_BIAS=correction_bias is not None and not hashed,
        RENORMALIZE=renormalize,
        BLOCK_G=triton.next_power_of_2(groups), BLOCK_S=triton.next_power_of_2(group_size),
        BLOCK_K=triton.next_power_of_2(top_k),
    )
