"""cpu fused_moe against the reference: unquantised and fp8 block-scaled weights, and
an expert map that leaves some experts on other ranks (-1)."""

from __future__ import annotations

import pytest
import torch

TOKENS, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 6, 128, 128, 4, 2


def _routing(index_dtype: torch.dtype, num_ids: int = EXPERTS) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(num_ids)[:TOP_K] for _ in range(TOKENS)]).to(index_dtype)
    return torch.rand(TOKENS, TOP_K), ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_fused_moe_matches_reference(assert_matches_reference, dtype, index_dtype) -> None:
    hidden = torch.randn(TOKENS, HIDDEN).to(dtype)
    w13 = (torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN) / HIDDEN**0.5).to(dtype)
    w2 = (torch.randn(EXPERTS, HIDDEN, INTERMEDIATE) / INTERMEDIATE**0.5).to(dtype)
    assert_matches_reference("fused_moe", hidden, w13, w2, *_routing(index_dtype))


def test_experts_mapped_to_minus_one_contribute_nothing(assert_matches_reference) -> None:
    hidden = torch.randn(TOKENS, HIDDEN)
    w13, w2 = torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN) / 12, torch.randn(EXPERTS, HIDDEN, INTERMEDIATE) / 12
    global_experts = 2 * EXPERTS
    expert_map = torch.full((global_experts,), -1, dtype=torch.int32)
    expert_map[1::2] = torch.arange(EXPERTS, dtype=torch.int32)  # this rank holds the odd ones
    weights, ids = _routing(torch.int64, global_experts)
    assert_matches_reference("fused_moe", hidden, w13, w2, weights, ids, expert_map)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("intermediate", [INTERMEDIATE, 96])  # whole and partial 128-tiles
def test_fp8_block_scaled_experts_match_reference(assert_matches_reference, fp8, intermediate) -> None:
    hidden = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    w13 = torch.randn(EXPERTS, 2 * intermediate, HIDDEN).to(fp8)
    w2 = torch.randn(EXPERTS, HIDDEN, intermediate).to(fp8)
    w13_scale = torch.rand(EXPERTS, -(-2 * intermediate // 128), HIDDEN // 128) / 16
    w2_scale = torch.rand(EXPERTS, HIDDEN // 128, -(-intermediate // 128)) / 12
    weights, ids = _routing(torch.int32)
    assert_matches_reference("fused_moe", hidden, w13, w2, weights, ids, None, w13_scale, w2_scale)
