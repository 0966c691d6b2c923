"""moe_route against transformers' Qwen3-MoE and DeepSeek-V3 routers, and fused_moe
against a dense computation of every expert for every token."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config, Qwen3MoeConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

TOKENS = 6


def _identity_router(router: torch.nn.Module, logits: torch.Tensor):
    """Run a transformers router whose gate is the identity, so its logits are ours."""
    with torch.no_grad():
        router.weight.copy_(torch.eye(logits.shape[1]))
        return router(logits)


def _as_sets(ids: torch.Tensor) -> list[set[int]]:
    return [set(row) for row in ids.tolist()]


def _weights_by_id(ids: torch.Tensor, weights: torch.Tensor) -> list[dict[int, float]]:
    return [dict(zip(i, w)) for i, w in zip(ids.tolist(), weights.tolist())]


def _assert_same_routing(ids, weights, expected_ids, expected_weights) -> None:
    assert _as_sets(ids) == _as_sets(expected_ids)
    got, want = _weights_by_id(ids, weights), _weights_by_id(expected_ids, expected_weights)
    for row_got, row_want in zip(got, want):
        assert row_got == pytest.approx(row_want, rel=1e-6)


@pytest.mark.parametrize("renormalize", [False, True])
def test_softmax_topk_routing_matches_qwen3_moe_router(ops, renormalize) -> None:
    experts, top_k = 8, 2
    logits = torch.randn(TOKENS, experts)
    config = Qwen3MoeConfig(
        hidden_size=experts, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=renormalize
    )
    _, hf_weights, hf_ids = _identity_router(Qwen3MoeTopKRouter(config), logits)
    weights, ids = ops.moe_route(logits, top_k=top_k, renormalize=renormalize)
    _assert_same_routing(ids, weights, hf_ids, hf_weights)


def test_sigmoid_group_limited_routing_with_bias_matches_deepseek_v3_router(ops) -> None:
    experts, top_k, n_group, topk_group, scaling = 16, 4, 4, 2, 2.5
    logits, bias = torch.randn(TOKENS, experts), torch.randn(experts) * 0.5
    config = DeepseekV3Config(
        hidden_size=experts, n_routed_experts=experts, num_experts_per_tok=top_k, n_group=n_group,
        topk_group=topk_group, norm_topk_prob=True, routed_scaling_factor=scaling,
    )
    router = DeepseekV3TopkRouter(config)
    router.e_score_correction_bias.copy_(bias)
    _, hf_weights, hf_ids = _identity_router(router, logits)
    weights, ids = ops.moe_route(
        logits, bias, top_k=top_k, scoring="sigmoid", renormalize=True, n_group=n_group,
        topk_group=topk_group, routed_scaling_factor=scaling,
    )
    _assert_same_routing(ids, weights, hf_ids, hf_weights)


def test_group_limit_keeps_every_chosen_expert_inside_the_best_groups(ops) -> None:
    # Group 0 holds the single best expert but its runner-up is poor; groups 1 and 2
    # are strong on their two best, so with topk_group=2 expert 0 must not be chosen.
    logits = torch.tensor([[9.0, -9.0, -9.0, -9.0, 5.0, 5.0, -9.0, -9.0, 4.0, 4.0, -9.0, -9.0]])
    _, ids = ops.moe_route(logits, top_k=4, scoring="sigmoid", n_group=3, topk_group=2)
    assert _as_sets(ids) == [{4, 5, 8, 9}]


def test_sqrt_softplus_routing_picks_the_largest_logits_and_weighs_them_by_sqrt_softplus(ops) -> None:
    logits = torch.randn(TOKENS, 8)
    weights, ids = ops.moe_route(logits, top_k=3, scoring="sqrt_softplus")
    # sqrt(softplus) is increasing, so the top scores are the top logits.
    assert _as_sets(ids) == _as_sets(logits.topk(3).indices)
    chosen = logits.gather(1, ids.long())
    torch.testing.assert_close(weights, torch.log1p(chosen.exp()).sqrt())


@pytest.mark.parametrize("token_dtype,table_dtype", [(torch.int32, torch.int64), (torch.int64, torch.int32)])
def test_hash_routing_takes_ids_from_the_table_row_of_each_token(ops, token_dtype, table_dtype) -> None:
    experts, vocab, top_k = 8, 20, 2
    logits = torch.randn(TOKENS, experts)
    table = torch.stack([torch.randperm(experts)[:top_k] for _ in range(vocab)]).to(table_dtype)
    tokens = torch.tensor([3, 19, 0, 3, 7, 11], dtype=token_dtype)
    weights, ids = ops.moe_route(logits, None, tokens, table, top_k=top_k, selection="hash")
    assert ids.tolist() == [table[t].tolist() for t in tokens.tolist()]
    torch.testing.assert_close(weights, logits.softmax(-1).gather(1, ids.long()))


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_route_writes_ids_at_the_requested_width(ops, ids_dtype) -> None:
    _, ids = ops.moe_route(torch.randn(TOKENS, 8), top_k=2, ids_dtype=ids_dtype)
    assert ids.dtype == ids_dtype


def _dense_moe(hidden, w13, w2, routing: torch.Tensor) -> torch.Tensor:
    """Every expert on every token in fp64, combined with a dense [T, E] weight matrix."""
    x = hidden.double()
    gate, up = torch.einsum("th,eih->eti", x, w13.double()).chunk(2, dim=-1)
    per_expert = torch.einsum("eti,ehi->eth", F.silu(gate) * up, w2.double())
    return torch.einsum("te,eth->th", routing, per_expert)


def _routing_matrix(ids: torch.Tensor, weights: torch.Tensor, experts: int) -> torch.Tensor:
    return (F.one_hot(ids.long(), experts).double() * weights.double()[..., None]).sum(dim=1)


def _moe_weights(experts: int, hidden: int, intermediate: int, dtype=torch.float32):
    return (
        torch.randn(experts, 2 * intermediate, hidden, dtype=dtype) / hidden**0.5,
        torch.randn(experts, hidden, intermediate, dtype=dtype) / intermediate**0.5,
    )


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_fused_moe_matches_dense_computation_of_every_expert(ops, ids_dtype) -> None:
    experts, top_k = 4, 2
    hidden = torch.randn(TOKENS, 16)
    w13, w2 = _moe_weights(experts, 16, 12)
    weights, ids = torch.rand(TOKENS, top_k), torch.stack([torch.randperm(experts)[:top_k] for _ in range(TOKENS)])
    out = ops.fused_moe(hidden, w13, w2, weights, ids.to(ids_dtype))
    expected = _dense_moe(hidden, w13, w2, _routing_matrix(ids, weights, experts))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_fused_moe_bf16_rounds_once_to_bf16(ops) -> None:
    hidden = torch.randn(TOKENS, 16).bfloat16()
    w13, w2 = _moe_weights(4, 16, 8, torch.bfloat16)
    weights, ids = torch.rand(TOKENS, 2), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, 3]])
    out = ops.fused_moe(hidden, w13, w2, weights, ids)
    assert out.dtype == torch.bfloat16
    expected = _dense_moe(hidden, w13, w2, _routing_matrix(ids, weights, 4))
    torch.testing.assert_close(out, expected.bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize("map_dtype", [torch.int32, torch.int64])
def test_fused_moe_expert_map_drops_experts_held_by_other_ranks(ops, map_dtype) -> None:
    global_experts, top_k = 6, 3
    local = [4, 1, 5]  # this rank holds global experts 4, 1, 5 as local 0, 1, 2
    expert_map = torch.full((global_experts,), -1)
    expert_map[local] = torch.arange(len(local))
    hidden = torch.randn(TOKENS, 16)
    w13, w2 = _moe_weights(global_experts, 16, 8)
    weights = torch.rand(TOKENS, top_k)
    ids = torch.stack([torch.randperm(global_experts)[:top_k] for _ in range(TOKENS)]).int()
    out = ops.fused_moe(hidden, w13[local], w2[local], weights, ids, expert_map.to(map_dtype))
    routing = _routing_matrix(ids, weights, global_experts)
    off_rank = [e for e in range(global_experts) if e not in local]
    routing[:, off_rank] = 0
    expected = _dense_moe(hidden, w13, w2, routing)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_fused_moe_fp8_weights_are_dequantised_by_128x128_block_scales(ops) -> None:
    experts, hidden_size, intermediate = 2, 160, 72  # partial last blocks on every axis
    hidden = torch.randn(3, hidden_size)
    w13, w2 = (w.to(torch.float8_e4m3fn) for w in _moe_weights(experts, hidden_size, intermediate))
    w13_scale = torch.rand(experts, 2, 2) + 0.5  # cdiv(144,128) x cdiv(160,128)
    w2_scale = torch.rand(experts, 2, 1) + 0.5  # cdiv(160,128) x cdiv(72,128)
    weights, ids = torch.rand(3, 2), torch.tensor([[0, 1], [1, 0], [1, 0]])
    out = ops.fused_moe(hidden, w13, w2, weights, ids, None, w13_scale, w2_scale)

    def dequantised(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        result = w.double().clone()
        for e, i, j in torch.cartesian_prod(*(torch.arange(n) for n in scale.shape)).tolist():
            result[e, 128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)] *= float(scale[e, i, j])
        return result

    routing = _routing_matrix(ids, weights, experts)
    expected = _dense_moe(hidden, dequantised(w13, w13_scale), dequantised(w2, w2_scale), routing)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
