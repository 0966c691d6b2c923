"""cpu linear against the reference: on plain weights and on weights the backend
prepacked at load, with and without bias, over row counts a packed layout must serve
(one decode row through a prefill chunk), and strided activations."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.backends.cpu import cpu_has_native_bf16
from accord.op_contracts import CONTRACTS, ContractError

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCE = CONTRACTS["linear"].tolerance


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_plain_weight_matches_reference(assert_matches_reference, dtype, with_bias) -> None:
    x, weight = torch.randn(9, 72).to(dtype), (torch.randn(40, 72) / 8).to(dtype)
    bias = torch.randn(40).to(dtype) if with_bias else None
    assert_matches_reference("linear", x, weight, bias)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_prepacked_weight_matches_reference(cpu_ops, reference_ops, nmse_of, dtype, rows, with_bias) -> None:
    weight = (torch.randn(96, 128) / 11).to(dtype)
    bias = torch.randn(96).to(dtype) if with_bias else None
    packed = get_backend("cpu").prepare_linear_weight(weight)
    x = torch.randn(rows, 128).to(dtype)
    got = cpu_ops.linear(x, packed, bias)
    want = reference_ops.linear(x, weight, bias)
    assert got.dtype == dtype and got.shape == (rows, 96)
    assert nmse_of(got, want) <= TOLERANCE[dtype]


def test_fp32_weights_are_prepacked_and_half_types_only_with_native_bf16() -> None:
    backend = get_backend("cpu")
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN: weights stay plain")
    assert backend.prepare_linear_weight(torch.randn(8, 16)).is_mkldnn
    packed_bf16 = backend.prepare_linear_weight(torch.randn(8, 16).bfloat16()).is_mkldnn
    assert packed_bf16 == cpu_has_native_bf16()


def test_linear_takes_strided_activations(cpu_ops, reference_ops, nmse_of) -> None:
    weight = torch.randn(24, 32)
    packed = get_backend("cpu").prepare_linear_weight(weight)
    x = torch.randn(5, 64)[:, ::2]
    assert not x.is_contiguous()
    assert nmse_of(cpu_ops.linear(x, packed), reference_ops.linear(x, weight)) <= TOLERANCE[torch.float32]


def test_linear_refuses_a_width_mismatch_on_a_prepacked_weight(cpu_ops) -> None:
    packed = get_backend("cpu").prepare_linear_weight(torch.randn(24, 32))
    with pytest.raises(ContractError, match="linear"):
        cpu_ops.linear(torch.randn(2, 31), packed)
