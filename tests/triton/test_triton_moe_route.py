"""The Triton MoE router chooses the reference's experts (compared as sets per token)
with the reference's weights, for every scoring, group limits with correction bias,
and hash routing with independently sized index tensors."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import INDEX_DTYPES


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _assert_same_routes(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Same id dtype, the same set of experts per token, and each expert's weight."""
    (weights, ids), (weights_ref, ids_ref) = got, want
    assert ids.dtype == ids_ref.dtype
    order, order_ref = ids.long().sort(dim=1), ids_ref.long().sort(dim=1)
    assert torch.equal(order.values, order_ref.values)
    torch.testing.assert_close(weights.gather(1, order.indices), weights_ref.gather(1, order_ref.indices))


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid", "sqrt_softplus"])
@pytest.mark.parametrize("ids_dtype", INDEX_DTYPES)
def test_moe_route_top_k_matches_reference(triton_ops, reference_ops, scoring, renormalize, ids_dtype):
    logits = _randn(5, 12).to(torch.bfloat16)
    kwargs = dict(top_k=3, scoring=scoring, renormalize=renormalize, routed_scaling_factor=2.5, ids_dtype=ids_dtype)
    _assert_same_routes(triton_ops.moe_route(logits, **kwargs), reference_ops.moe_route(logits, **kwargs))


@pytest.mark.parametrize("n_group, topk_group", [(4, 2), (6, 3), (12, 5)])
def test_moe_route_grouped_sigmoid_with_correction_bias_matches_reference(
    triton_ops, reference_ops, n_group, topk_group
):
    logits, bias = _randn(6, 12), _randn(12, seed=1) * 0.5
    kwargs = dict(top_k=4, scoring="sigmoid", renormalize=True, n_group=n_group, topk_group=topk_group)
    _assert_same_routes(triton_ops.moe_route(logits, bias, **kwargs), reference_ops.moe_route(logits, bias, **kwargs))


def test_moe_route_correction_bias_changes_the_choice_but_never_a_weight(triton_ops):
    logits = torch.zeros(1, 4)
    bias = torch.tensor([0.0, 0.0, 0.0, 1.0])
    weights, ids = triton_ops.moe_route(logits, bias, top_k=1, scoring="sigmoid")
    assert ids.tolist() == [[3]] and weights.tolist() == [[0.5]]


@pytest.mark.parametrize("token_ids_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("table_dtype", INDEX_DTYPES)
def test_moe_route_hash_reads_each_index_tensor_at_its_own_width(
    triton_ops, reference_ops, token_ids_dtype, table_dtype
):
    logits = _randn(4, 8)
    token_ids = torch.tensor([9, 0, 3, 9], dtype=token_ids_dtype)
    hash_table = torch.randint(0, 8, (10, 2), generator=torch.Generator().manual_seed(1)).to(table_dtype)
    kwargs = dict(top_k=2, selection="hash", scoring="sqrt_softplus", ids_dtype=torch.int64)
    got = triton_ops.moe_route(logits, None, token_ids, hash_table, **kwargs)
    _assert_same_routes(got, reference_ops.moe_route(logits, None, token_ids, hash_table, **kwargs))
    assert torch.equal(got[1], hash_table.long()[token_ids.long()])
