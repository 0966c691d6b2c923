"""Equality as the contracts define it: NMSE within tolerance, NaN always fails, Inf
must match, indices exact, top-k ids as sets, fp8 by dequantised value (the last two
as each contract declares, whatever the op's name)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from accord.conformance.compare import compare_outputs, dequantise, nmse, nonfinite_problem, same_bits
from accord.op_contracts import CONTRACTS, Dequantised, UnorderedRows


def test_nmse_is_squared_error_over_squared_reference() -> None:
    assert nmse(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.0])) == 0.0
    # error 0.5^2 + 0.5^2 = 0.5 over reference 3^2 + 4^2 = 25
    assert nmse(torch.tensor([3.5, 4.5]), torch.tensor([3.0, 4.0])) == pytest.approx(0.02, rel=1e-12)


def test_any_nan_is_a_problem() -> None:
    assert "NaN" in nonfinite_problem(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]))


def test_inf_must_match_the_reference() -> None:
    inf = float("inf")
    assert nonfinite_problem(torch.tensor([inf, 1.0]), torch.tensor([inf, 1.0])) is None
    assert nonfinite_problem(torch.tensor([inf, 1.0]), torch.tensor([1.0, 1.0])) is not None
    assert nonfinite_problem(torch.tensor([-inf, 1.0]), torch.tensor([inf, 1.0])) is not None


def _route(ids: list[list[int]], weights: list[list[float]]) -> dict[str, torch.Tensor]:
    return {"topk_weights": torch.tensor(weights), "topk_ids": torch.tensor(ids, dtype=torch.int32)}


def test_topk_ids_compare_as_sets_with_their_weights() -> None:
    want = _route([[3, 7]], [[0.6, 0.4]])
    reordered = _route([[7, 3]], [[0.4, 0.6]])
    assert compare_outputs(CONTRACTS["moe_route"], {}, reordered, want, 1e-9).failures == []


def test_the_set_comparison_is_the_contracts_declaration_not_its_name() -> None:
    """A new op declaring unordered rows gets the set comparison; the same op without
    the declaration compares ids in order."""
    want, reordered = _route([[3, 7]], [[0.6, 0.4]]), _route([[7, 3]], [[0.4, 0.6]])
    declared = dataclasses.replace(CONTRACTS["moe_route"], name="my_route")
    undeclared = dataclasses.replace(declared, unordered_rows=None)
    assert compare_outputs(declared, {}, reordered, want, 1e-9).failures == []
    assert compare_outputs(undeclared, {}, reordered, want, 1e-9).failures != []


@pytest.mark.parametrize(
    "rules",
    [
        {"unordered_rows": UnorderedRows("ids")},
        {"unordered_rows": UnorderedRows("topk_ids", ("weights",))},
        {"dequantised": Dequantised("topk_ids", "topk_weights", "group")},
    ],
)
def test_comparison_rules_naming_what_the_contract_lacks_are_refused(rules: dict) -> None:
    with pytest.raises(ValueError, match="my_route"):
        dataclasses.replace(CONTRACTS["moe_route"], name="my_route", **rules)


def test_topk_weights_must_follow_their_ids() -> None:
    want = _route([[3, 7]], [[0.6, 0.4]])
    swapped = _route([[7, 3]], [[0.6, 0.4]])
    assert compare_outputs(CONTRACTS["moe_route"], {}, swapped, want, 1e-9).failures != []


def test_index_outputs_compare_exactly() -> None:
    want = _route([[3, 7]], [[0.6, 0.4]])
    other_expert = _route([[3, 8]], [[0.6, 0.4]])
    failures = compare_outputs(CONTRACTS["moe_route"], {}, other_expert, want, 1e-9).failures
    assert failures == ["topk_ids: 1 of 2 elements differ (exact)"]


def test_output_dtype_must_match_the_reference() -> None:
    want = _route([[3, 7]], [[0.6, 0.4]])
    wide = {**want, "topk_ids": want["topk_ids"].long()}
    assert "expected torch.int32" in compare_outputs(CONTRACTS["moe_route"], {}, wide, want, 1e-9).failures[0]


def test_quantised_outputs_compare_by_dequantised_value() -> None:
    fp8 = torch.float8_e4m3fn
    want = {"q": torch.tensor([[2.0, 4.0]]).to(fp8), "scales": torch.tensor([[1.0]])}
    same_values = {"q": torch.tensor([[1.0, 2.0]]).to(fp8), "scales": torch.tensor([[2.0]])}
    args = {"group_size": 128}
    failures = compare_outputs(CONTRACTS["quantize_fp8"], args, same_values, want, 1e-3).failures
    assert failures == ["scales: NMSE 1 > 0.001"]  # q itself passes: same dequantised values


def test_group_scales_cover_their_columns() -> None:
    q = torch.ones(1, 5)
    assert dequantise(q, torch.tensor([[2.0, 3.0]]), 3).tolist() == [[2.0, 2.0, 2.0, 3.0, 3.0]]


def test_same_bits_compares_bytes_not_values() -> None:
    nan = torch.tensor([float("nan")])
    assert same_bits(nan, nan.clone())  # equal bits, though NaN != NaN
    assert not same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))  # 0.0 == -0.0, other bits
