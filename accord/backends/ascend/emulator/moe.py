"""The MoE operators: gating (npu_moe_gating_top_k_softmax, npu_moe_gating_top_k),
token routing (npu_moe_init_routing, npu_moe_compute_expert_tokens), the grouped GEMM
(npu_grouped_matmul, single x / single 3-D weight, m-axis groups) and the weighted
combine (npu_moe_finalize_routing). Every expert-id tensor they take or return is int32:
that is the restriction an int64 id breaks."""

from __future__ import annotations

from typing import Sequence

import torch

from ._checks import FLOATS, contiguous, dtype_in, rank_in, require, same_dtype

_INDEX = (torch.int32, torch.int64)
MAX_GATING_EXPERTS = 2048
MAX_SOFTMAX_K = 1024


def npu_moe_gating_top_k_softmax(
    x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, expert_idx, row_idx): the top k of softmax(x) per row (y at x's dtype),
    their expert ids (int32) and row_idx[i, j] = j * rows + i (int32, the k-major source
    row index npu_moe_init_routing takes). x 2-D fp16/bf16/fp32; 0 < k <= min(E, 1024)."""
    op = "npu_moe_gating_top_k_softmax"
    dtype_in(op, "x", x, FLOATS)
    rank_in(op, "x", x, (2,))
    require(finished is None, op, "finished", "None (row masking is not emulated)", "a tensor")
    require(0 < k <= min(x.shape[-1], MAX_SOFTMAX_K), op, "k", f"in 1..{min(x.shape[-1], MAX_SOFTMAX_K)}", k)
    values, ids = torch.softmax(x.float(), dim=-1).topk(k, dim=-1)
    rows = x.shape[0]
    row_idx = torch.arange(rows * k, dtype=torch.int32).view(k, rows).t().contiguous()
    return values.to(x.dtype), ids.to(torch.int32), row_idx


def _grouped_choice(choice: torch.Tensor, group_count: int, k_group: int, group_select_mode: int) -> torch.Tensor:
    """`choice` with every expert outside the best k_group groups set to -inf."""
    rows, experts = choice.shape
    grouped = choice.view(rows, group_count, experts // group_count)
    score = grouped.amax(dim=-1) if group_select_mode == 0 else grouped.topk(2, dim=-1).values.sum(dim=-1)
    keep = torch.zeros_like(score, dtype=torch.bool).scatter_(1, score.topk(k_group, dim=-1).indices, True)
    return grouped.masked_fill(~keep[..., None], float("-inf")).view(rows, experts)


def npu_moe_gating_top_k(
    x: torch.Tensor,
    k: int,
    *,
    bias: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
    tid2eid: torch.Tensor | None = None,
    k_group: int = 1,
    group_count: int = 1,
    group_select_mode: int = 0,
    renorm: int = 0,
    norm_type: int = 0,
    out_flag: bool = False,
    routed_scaling_factor: float = 1.0,
    eps: float = 1e-20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y_out, expert_idx_out int32, norm_out fp32): norm = softmax (norm_type 0) or
    sigmoid (1) of x; ids = top k of norm + bias within the best k_group of group_count
    groups (group score: max, or sum of the top 2 with group_select_mode 1), or
    tid2eid[input_ids] in hash mode; y_out = norm at ids, for sigmoid divided by their
    sum + eps, times routed_scaling_factor. x 2-D fp16/bf16/fp32 with E <= 2048; bias
    of x's dtype; E / group_count > 2; renorm 0 only."""
    op = "npu_moe_gating_top_k"
    dtype_in(op, "x", x, FLOATS)
    rank_in(op, "x", x, (2,))
    rows, experts = x.shape
    require(experts <= MAX_GATING_EXPERTS, op, "x", f"at most {MAX_GATING_EXPERTS} experts", experts)
    require(renorm == 0, op, "renorm", "0 (the only supported value)", renorm)
    require(norm_type in (0, 1), op, "norm_type", "0 (softmax) or 1 (sigmoid)", norm_type)
    require(group_select_mode in (0, 1), op, "group_select_mode", "0 or 1", group_select_mode)
    require(group_count > 0 and experts % group_count == 0 and experts // group_count > 2, op, "group_count",
            f"a divisor of {experts} experts leaving more than 2 per group", group_count)
    require(1 <= k_group <= group_count, op, "k_group", f"1..{group_count}", k_group)
    require(1 <= k <= experts // group_count * k_group, op, "k", f"1..{experts // group_count * k_group}", k)
    norm = torch.softmax(x.float(), dim=-1) if norm_type == 0 else torch.sigmoid(x.float())
    if tid2eid is not None or input_ids is not None:
        require(tid2eid is not None and input_ids is not None, op, "input_ids", "given together with tid2eid", "one of them")
        assert tid2eid is not None and input_ids is not None
        dtype_in(op, "input_ids", input_ids, _INDEX)
        dtype_in(op, "tid2eid", tid2eid, _INDEX)
        require(input_ids.shape == (rows,), op, "input_ids", f"[{rows}]", tuple(input_ids.shape))
        require(tid2eid.dim() == 2 and tid2eid.shape[1] == k, op, "tid2eid", f"2-D with k={k} columns", tuple(tid2eid.shape))
        ids = tid2eid.long()[input_ids.long()]
    else:
        choice = norm
        if bias is not None:
            same_dtype(op, "bias", bias, "x", x)
            require(bias.shape == (experts,), op, "bias", f"[{experts}]", tuple(bias.shape))
            choice = norm + bias.float()
        if group_count > 1:
            choice = _grouped_choice(choice, group_count, k_group, group_select_mode)
        ids = choice.topk(k, dim=-1).indices
    y = norm.gather(1, ids)
    if norm_type == 1:
        y = y / (y.sum(dim=-1, keepdim=True) + eps)
    return (y * routed_scaling_factor).to(x.dtype), ids.to(torch.int32), norm


def npu_moe_init_routing(
    x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expanded_x, expanded_row_idx, expanded_expert_idx): the N*K (row, expert) pairs
    sorted by expert (stable in row_idx order); expanded_x[j] = x[source row of pair j],
    expanded_row_idx[row_idx value] = its place j, expanded_expert_idx the sorted ids.
    x 2-D fp16/bf16/fp32; row_idx and expert_idx int32 [N, K]."""
    op = "npu_moe_init_routing"
    dtype_in(op, "x", x, FLOATS)
    rank_in(op, "x", x, (2,))
    dtype_in(op, "row_idx", row_idx, (torch.int32,))
    dtype_in(op, "expert_idx", expert_idx, (torch.int32,))
    rows, top_k = expert_idx.shape
    require(row_idx.shape == expert_idx.shape, op, "row_idx", f"expert_idx's shape {tuple(expert_idx.shape)}", tuple(row_idx.shape))
    require(x.shape[0] == rows, op, "x", f"{rows} rows like expert_idx", x.shape[0])
    require(bool((expert_idx >= 0).all()), op, "expert_idx", "non-negative expert ids", expert_idx.tolist())
    # Sort the pairs by (expert, row_idx value): the stable order the operator keeps.
    sources = row_idx.long().flatten()
    keys = expert_idx.long().flatten() * (rows * top_k) + sources
    order = keys.argsort()
    sorted_sources = sources[order]
    active = min(rows, active_num) * top_k if active_num > 0 else rows * top_k
    expanded_x = x[(sorted_sources % rows)[:active]]
    expanded_row_idx = torch.empty(rows * top_k, dtype=torch.int32)
    expanded_row_idx[sorted_sources] = torch.arange(rows * top_k, dtype=torch.int32)
    return expanded_x, expanded_row_idx, expert_idx.flatten()[order].to(torch.int32)


def npu_moe_compute_expert_tokens(sorted_expert_for_source_row: torch.Tensor, num_expert: int) -> torch.Tensor:
    """int32 [num_expert]: for each expert, the end of its rows in the sorted order
    (the cumulative count, the group_list form type 0 of npu_grouped_matmul); the
    input is the sorted int32 expert ids npu_moe_init_routing returns."""
    op = "npu_moe_compute_expert_tokens"
    dtype_in(op, "sorted_expert_for_source_row", sorted_expert_for_source_row, (torch.int32,))
    ids = sorted_expert_for_source_row.long()
    require(bool(((ids >= 0) & (ids < num_expert)).all()), op, "sorted_expert_for_source_row", f"ids in [0, {num_expert})", ids.tolist())
    return torch.bincount(ids, minlength=num_expert).cumsum(0).to(torch.int32)


def _weight_layout_ok(weight: torch.Tensor) -> bool:
    """Contiguous, or contiguous with its last two axes swapped (the documented
    'transposed weight' layout)."""
    return weight.is_contiguous() or weight.transpose(-1, -2).is_contiguous()


def npu_grouped_matmul(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    *,
    bias: Sequence[torch.Tensor] | None = None,
    group_list: torch.Tensor | None = None,
    split_item: int = 0,
    group_type: int | None = None,
    group_list_type: int = 0,
    act_type: int = 0,
    output_dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """[y]: rows of group i of x times weight[i] (fp32 accumulation, rounded to x's
    dtype). Only the single-x, single 3-D weight [E, K, N] form with m-axis groups is
    emulated (group_type 0, split_item 2 or 3); x and weight of one dtype (fp16/bf16/
    fp32, non-quantised); group_list int64 [E], cumulative (type 0, non-decreasing) or
    per-group counts (type 1), covering at most x's rows."""
    op = "npu_grouped_matmul"
    require(len(x) == 1 and len(weight) == 1, op, "x", "one tensor with one stacked weight (the emulated form)", f"{len(x)} x, {len(weight)} weights")
    require(bias is None and act_type == 0 and output_dtype is None, op, "bias", "absent with act_type 0 and no output_dtype (the emulated form)", "given")
    require(group_type == 0 and split_item in (2, 3), op, "group_type", "0 with split_item 2 or 3 (single x, single y)", (group_type, split_item))
    (rows,), (stacked,) = x, weight
    dtype_in(op, "x", rows, FLOATS)
    same_dtype(op, "weight", stacked, "x", rows)
    rank_in(op, "x", rows, (2,))
    rank_in(op, "weight", stacked, (3,))
    contiguous(op, "x", rows)
    require(_weight_layout_ok(stacked), op, "weight", "contiguous or transposed in its last two axes", f"strides {stacked.stride()}")
    require(stacked.shape[1] == rows.shape[1], op, "weight", f"K={rows.shape[1]} rows per expert", tuple(stacked.shape))
    require(group_list is not None, op, "group_list", "a tensor", None)
    assert group_list is not None
    dtype_in(op, "group_list", group_list, (torch.int64,))
    require(group_list.shape == (stacked.shape[0],), op, "group_list", f"[{stacked.shape[0]}] (one entry per weight group)", tuple(group_list.shape))
    require(group_list_type in (0, 1), op, "group_list_type", "0 (cumsum) or 1 (counts)", group_list_type)
    counts = group_list if group_list_type == 1 else torch.diff(group_list, prepend=group_list.new_zeros(1))
    require(bool((counts >= 0).all()) and int(counts.sum()) <= rows.shape[0], op, "group_list",
            f"non-negative groups covering at most {rows.shape[0]} rows", group_list.tolist())
    out = torch.zeros(rows.shape[0], stacked.shape[2], dtype=rows.dtype)
    start = 0
    for expert, count in enumerate(counts.tolist()):
        out[start : start + count] = (rows[start : start + count].float() @ stacked[expert].float()).to(rows.dtype)
        start += count
    return [out]


def npu_moe_finalize_routing(
    expanded_permuted_rows: torch.Tensor,
    skip1: torch.Tensor | None,
    skip2: torch.Tensor | None,
    bias: torch.Tensor | None,
    scales: torch.Tensor | None,
    expanded_src_to_dst_row: torch.Tensor,
    export_for_source_row: torch.Tensor | None,
    drop_pad_mode: int = 0,
    k: int = 1,
) -> torch.Tensor:
    """out[i] = skip1 + skip2 + sum_k scales[i, k] * (rows[src_to_dst[i + k * N]] +
    bias[expert]); rows 2-D fp16/bf16/fp32, skips, bias and scales of its dtype,
    src_to_dst int32 [N*K] in [0, N*K), export_for_source_row int32 [N, K]."""
    op = "npu_moe_finalize_routing"
    rows = expanded_permuted_rows
    dtype_in(op, "expanded_permuted_rows", rows, FLOATS)
    rank_in(op, "expanded_permuted_rows", rows, (2,))
    require(drop_pad_mode == 0, op, "drop_pad_mode", "0", drop_pad_mode)
    require(skip2 is None or skip1 is not None, op, "skip1", "given whenever skip2 is", None)
    dtype_in(op, "expanded_src_to_dst_row", expanded_src_to_dst_row, (torch.int32,))
    top_k = scales.shape[1] if scales is not None else k
    tokens = rows.shape[0] // top_k
    require(expanded_src_to_dst_row.shape == (tokens * top_k,), op, "expanded_src_to_dst_row", f"[{tokens * top_k}]", tuple(expanded_src_to_dst_row.shape))
    destinations = expanded_src_to_dst_row.long()
    require(bool(((destinations >= 0) & (destinations < tokens * top_k)).all()), op, "expanded_src_to_dst_row", f"in [0, {tokens * top_k})", "out of range")
    out = torch.zeros(tokens, rows.shape[1], dtype=torch.float32)
    for name, skip in (("skip1", skip1), ("skip2", skip2)):
        if skip is not None:
            same_dtype(op, name, skip, "expanded_permuted_rows", rows)
            out += skip.float()
    if scales is not None:
        same_dtype(op, "scales", scales, "expanded_permuted_rows", rows)
        require(scales.shape == (tokens, top_k), op, "scales", f"[{tokens}, {top_k}]", tuple(scales.shape))
    if bias is not None:
        same_dtype(op, "bias", bias, "expanded_permuted_rows", rows)
        require(export_for_source_row is not None, op, "export_for_source_row", "given with bias", None)
    if export_for_source_row is not None:
        dtype_in(op, "export_for_source_row", export_for_source_row, (torch.int32,))
        require(export_for_source_row.shape == (tokens, top_k), op, "export_for_source_row", f"[{tokens}, {top_k}]", tuple(export_for_source_row.shape))
    for j in range(top_k):
        picked = rows[destinations[j * tokens : (j + 1) * tokens]].float()
        if bias is not None and export_for_source_row is not None:
            picked = picked + bias.float()[export_for_source_row[:, j].long()]
        weight = scales[:, j : j + 1].float() if scales is not None else 1.0
        out += weight * picked
    return out.to(rows.dtype)


