"""The group_quant_linear contract: a legal call multiplies by (code - zero) * scale of
each channel's group, codes read from bit k*bits of the packed row; illegal calls (a row
a word short, scales of the wrong width, a bit width or group size it does not take,
codes that are not int32) are refused with a ContractError naming the argument."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.op_contracts import ContractError, OpDispatcher


@pytest.fixture(scope="module", params=["reference", "cpu"])
def ops(request: pytest.FixtureRequest) -> OpDispatcher:
    return OpDispatcher(get_backend(request.param), strict=True)


def test_codes_are_read_low_bits_first_and_offset_by_the_symmetric_zero(ops: OpDispatcher) -> None:
    # Codes 1, 2, 15 at bits 0, 4, 8; symmetric int4's zero is 8: weights -7, -6, 7 times 0.5.
    qweight = torch.tensor([[0xF21]], dtype=torch.int32)
    out = ops.group_quant_linear(
        torch.tensor([[1.0, 10.0, 100.0]]), qweight, torch.tensor([[0.5]]), None, None, None, bits=4, group_size=-1
    )
    assert out.tolist() == [[-3.5 - 30.0 + 350.0]]


def test_a_partial_last_group_takes_its_own_scale_and_zero(ops: OpDispatcher) -> None:
    # K = 9 int8 codes in 3 words, groups of 4: channels 0-3, 4-7 and the lone channel 8.
    codes = torch.tensor([[10, 11, 12, 13, 20, 21, 22, 23, 200]])
    padded = torch.nn.functional.pad(codes, (0, 3)).view(1, 3, 4)
    words = (padded[..., 0] | padded[..., 1] << 8 | padded[..., 2] << 16 | padded[..., 3] << 24).to(torch.int32)
    zeros = torch.tensor([[10, 20, 100]], dtype=torch.uint8)
    scales = torch.tensor([[1.0, 2.0, 0.25]])
    out = ops.group_quant_linear(torch.ones(1, 9), words, scales, zeros, None, None, bits=8, group_size=4)
    assert out.tolist() == [[(0 + 1 + 2 + 3) * 1.0 + (0 + 1 + 2 + 3) * 2.0 + 100 * 0.25]]


def test_g_idx_names_each_channels_group(ops: OpDispatcher) -> None:
    qweight = torch.tensor([[0x9999]], dtype=torch.int32)  # four codes of 9: one step above the zero
    g_idx = torch.tensor([1, 0, 1, 0], dtype=torch.int32)
    out = ops.group_quant_linear(
        torch.tensor([[1.0, 2.0, 3.0, 4.0]]), qweight, torch.tensor([[10.0, 100.0]]), None, g_idx, None,
        bits=4, group_size=2,
    )
    assert out.tolist() == [[100.0 + 20.0 + 300.0 + 40.0]]


def call(ops: OpDispatcher, words: int = 25, groups: int = 4, **params: object) -> torch.Tensor:
    return ops.group_quant_linear(
        torch.randn(2, 200), torch.zeros(8, words, dtype=params.pop("dtype", torch.int32)),  # type: ignore[arg-type]
        torch.ones(8, groups), None, None, None, **{"bits": 4, "group_size": 64, **params},
    )


def test_a_row_a_word_short_is_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match=r"qweight.*25 int32 words a row \(200 4-bit codes\)"):
        call(ops, words=24)


def test_scales_of_the_wrong_width_are_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match=r"scales.*4 groups a row \(K=200, group_size=64\).*3 columns"):
        call(ops, groups=3)


def test_a_bit_width_outside_the_contract_is_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match="bits"):
        call(ops, bits=3)


def test_a_group_size_of_zero_is_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match="group_size"):
        call(ops, group_size=0)


def test_codes_that_are_not_int32_are_refused(ops: OpDispatcher) -> None:
    with pytest.raises(ContractError, match="qweight"):
        call(ops, dtype=torch.uint8)
